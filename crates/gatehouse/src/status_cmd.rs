//! `gatehouse status`: the status Gatehouse computes for a folder of manifests, as YAML, JSON
//! or a kubectl-like table, and with `--strict` a check that fails on any problem.

use gatehouse_controlplane::{FileSource, check, status_report};
use gatehouse_translate::{Input, ObjectKey, Status, stamp_status, translate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Errors (and with `strict` every problem) go to stderr as `file:line: message` and make the
/// exit code 1, so `status` doubles as a manifest check in CI.
pub fn run(path: PathBuf, output: &str, strict: bool) -> ExitCode {
    let mut source = FileSource::new(&path);
    let loaded = source.load();
    let mut status = translate(&loaded.input, &Default::default()).status;
    stamp_status(
        &mut status,
        &Status::default(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    match output {
        "wide" => print!("{}", wide(&loaded.input, &status)),
        "json" => {
            let objects = status_report::objects(&loaded.input, &status);
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            println!(
                "{}",
                serde_json::to_string_pretty(&list).unwrap_or_default()
            );
        }
        _ => print!(
            "{}",
            status_report::to_yaml(&status_report::objects(&loaded.input, &status))
        ),
    }
    if strict {
        let problems = check::problems(&path, &loaded, &status);
        for p in &problems {
            eprintln!("{p}");
        }
        if problems.is_empty() {
            ExitCode::SUCCESS
        } else {
            eprintln!("{} problem(s)", problems.len());
            ExitCode::FAILURE
        }
    } else {
        for e in &loaded.errors {
            eprintln!("error: {e}");
        }
        if loaded.errors.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

/// A table of Gateways (with their listeners) and routes, with their conditions: a condition
/// in its good state shows as its type, one in its bad state as `!Type(Reason)`.
fn wide(input: &Input, status: &Status) -> String {
    let mut rows: Vec<[String; 4]> = vec![[
        "KIND".into(),
        "NAME".into(),
        "CONDITIONS".into(),
        "DETAIL".into(),
    ]];
    let mut gateways: Vec<_> = input.gateways.iter().collect();
    gateways.sort_by_key(|g| ObjectKey::of(&g.metadata));
    for gw in gateways {
        let key = ObjectKey::of(&gw.metadata);
        let Some(st) = status.gateways.get(&key) else {
            continue;
        };
        let address = st
            .addresses
            .iter()
            .flatten()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>()
            .join(",");
        rows.push([
            "Gateway".into(),
            key.to_string(),
            conditions(st.conditions.as_deref().unwrap_or_default()),
            format!("class {}, address {address}", gw.spec.gateway_class_name),
        ]);
        for l in st.listeners.iter().flatten() {
            let spec = gw.spec.listeners.iter().find(|s| s.name == l.name);
            let detail = spec.map_or(String::new(), |s| {
                format!(
                    "{} {}{}, {} route(s)",
                    s.protocol,
                    s.port,
                    s.hostname
                        .as_deref()
                        .map(|h| format!(" {h}"))
                        .unwrap_or_default(),
                    l.attached_routes
                )
            });
            rows.push([
                "  listener".into(),
                l.name.clone(),
                conditions(&l.conditions),
                detail,
            ]);
        }
    }
    for (route, st) in &status.routes {
        for p in &st.parents {
            let parent = format!(
                "{}/{}{}",
                p.parent_ref
                    .namespace
                    .as_deref()
                    .unwrap_or(&route.key.namespace),
                p.parent_ref.name,
                p.parent_ref
                    .section_name
                    .as_deref()
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default()
            );
            rows.push([
                route.kind.clone(),
                route.key.to_string(),
                conditions(&p.conditions),
                format!("parent {parent}"),
            ]);
        }
    }
    let widths: Vec<usize> = (0..3)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let _ = writeln!(
            out,
            "{:w0$}  {:w1$}  {:w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
    }
    out
}

fn conditions(conditions: &[Condition]) -> String {
    conditions
        .iter()
        .map(|c| {
            let good = match c.type_.as_str() {
                "Conflicted" | "PartiallyInvalid" => c.status == "False",
                _ => c.status == "True",
            };
            match (good, c.type_.as_str()) {
                // Conditions whose good state is "not so" are only worth showing when set.
                (true, "Conflicted" | "PartiallyInvalid") => String::new(),
                (true, t) => t.to_string(),
                (false, t) => format!("!{t}({})", c.reason),
            }
        })
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
