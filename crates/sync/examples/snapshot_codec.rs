//! What a snapshot costs to encode, compress and decode, timed in process: the IR of one HTTP
//! listener with N routes (a rule and a virtual host of its own each, as `bench/controlplane`
//! makes them), its JSON, gzip at level 6 (what tonic's gRPC compression uses, per stream) and
//! at level 1 (`compression::gzip`, once per snapshot), and back. The steps run in turn in
//! every round, so each figure is side by side with the others.
//!
//!   cargo run --release -p gatehouse-sync --example snapshot_codec [ROUTES] [ROUNDS]
//!
//! Prints the size of each form and the min and p50 of each step. Measures; asserts nothing.

use gatehouse_ir::{Config, VirtualHost};
use gatehouse_sync::{compression, version};
use gatehouse_testkit::ir;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let routes: usize = args.next().map_or(5000, |a| a.parse().expect("ROUTES"));
    let rounds: usize = args.next().map_or(20, |a| a.parse().expect("ROUNDS"));
    assert!(rounds > 0, "ROUNDS: at least one");

    let mut listener = ir::listener(80, None, Vec::new(), Vec::new());
    listener.rules = (0..routes)
        .map(|i| {
            ir::rule(
                &format!("r{i}"),
                vec![ir::to_cluster("default/svc:80")],
                vec![],
            )
        })
        .collect();
    listener.virtual_hosts = (0..routes)
        .map(|i| VirtualHost {
            hostname: format!("r{i}.example.com"),
            routes: vec![ir::prefix("/", i)],
        })
        .collect();
    let config = ir::config(
        vec![listener],
        vec![ir::http1(
            "default/svc:80",
            vec!["10.0.0.1:9000".parse().unwrap()],
        )],
    );

    let steps = [
        "JSON encode and hash (version::encode)",
        "gzip level 6 (tonic, per stream)",
        "gzip level 1 (compression::gzip, once)",
        "gunzip (compression::gunzip)",
        "JSON decode",
    ];
    let mut times = vec![Vec::with_capacity(rounds); steps.len()];
    let mut sizes = (0, 0, 0);
    for _ in 0..rounds {
        let mut timed = |step: usize, f: &mut dyn FnMut()| {
            let t = Instant::now();
            f();
            times[step].push(t.elapsed());
        };
        let mut json = Vec::new();
        timed(0, &mut || json = version::encode(&config).0);
        let mut level6 = Vec::new();
        timed(1, &mut || {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
            e.write_all(&json).unwrap();
            level6 = e.finish().unwrap();
        });
        let mut level1 = Vec::new();
        timed(2, &mut || level1 = compression::gzip(&json));
        let mut back = Vec::new();
        timed(3, &mut || {
            back = compression::gunzip(&level1, usize::MAX / 2).unwrap()
        });
        let mut decoded = None;
        timed(4, &mut || {
            decoded = Some(serde_json::from_slice::<Config>(&back).unwrap());
        });
        assert!(
            decoded.as_ref() == Some(&config),
            "the round trip gives the configuration"
        );
        // The level-6 stream decompresses to the same bytes too.
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&level6[..])
            .read_to_end(&mut out)
            .unwrap();
        assert!(out == json);
        sizes = (json.len(), level6.len(), level1.len());
    }
    println!(
        "{routes} routes: JSON {} bytes, gzip level 6 {} bytes, level 1 {} bytes; {rounds} rounds",
        sizes.0, sizes.1, sizes.2
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (name, mut t) in steps.iter().zip(times) {
        t.sort();
        println!(
            "  {name:40} min {:6.2} ms  p50 {:6.2} ms",
            ms(t[0]),
            ms(t[t.len() / 2])
        );
    }
}
