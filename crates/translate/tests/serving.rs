//! What the data plane reports back (addresses it could not bind) folded into status: a
//! listener whose socket is not listening is never Programmed.

use gatehouse_testkit::manifests::{self, Listener};
use gatehouse_translate::serving::{self, BindProblem, Serving};
use gatehouse_translate::{ObjectKey, Options, Status, translate};
use std::net::SocketAddr;

/// Gateway `gw` with HTTP listeners `web` (port 80) and `admin` (81), translated.
fn gateway_web_and_admin() -> gatehouse_translate::Output {
    let yaml = [
        manifests::gateway_class(),
        manifests::gateway(
            "gw",
            &[Listener::http("web", 80), Listener::http("admin", 81)],
        ),
    ]
    .join("---\n");
    translate(&manifests::input(&yaml), &Options::default())
}

fn status_with(unbound: &[(&str, &str, bool)]) -> Status {
    let out = gateway_web_and_admin();
    let serving = Serving {
        unbound: unbound
            .iter()
            .map(|(address, error, not_usable)| {
                let problem = BindProblem {
                    error: error.to_string(),
                    address_not_usable: *not_usable,
                };
                (address.parse::<SocketAddr>().unwrap(), problem)
            })
            .collect(),
        ..Serving::default()
    };
    let mut status = out.status;
    serving::apply(&mut status, &out.config, &serving);
    status
}

/// (status, reason, message) of a condition of the Gateway (`listener` None) or a listener.
fn programmed(status: &Status, listener: Option<&str>) -> (String, String, String) {
    let gw = &status.gateways[&ObjectKey::new("default", "gw")];
    let conditions = match listener {
        None => gw.conditions.as_ref().unwrap(),
        Some(name) => {
            &gw.listeners
                .iter()
                .flatten()
                .find(|l| l.name == name)
                .unwrap()
                .conditions
        }
    };
    let c = conditions.iter().find(|c| c.type_ == "Programmed").unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn everything_bound_changes_nothing() {
    let status = status_with(&[]);
    assert_eq!(programmed(&status, None).0, "True");
    assert_eq!(programmed(&status, Some("web")).0, "True");
    assert_eq!(programmed(&status, Some("admin")).0, "True");
}

#[test]
fn a_port_in_use_is_pending_and_the_gateway_says_how_much_serves() {
    let status = status_with(&[("0.0.0.0:81", "Address already in use (os error 98)", false)]);
    let (s, reason, message) = programmed(&status, Some("admin"));
    assert_eq!((s.as_str(), reason.as_str()), ("False", "Pending"));
    assert!(
        message.contains("cannot listen on 0.0.0.0:81: Address already in use (os error 98)"),
        "{message}"
    );
    assert_eq!(programmed(&status, Some("web")).0, "True");
    let (s, _, message) = programmed(&status, None);
    assert_eq!(s, "True", "the other listener serves");
    assert!(
        message.starts_with("1 of 2 listeners programmed"),
        "{message}"
    );
}

#[test]
fn nothing_bound_makes_the_gateway_pending() {
    let status = status_with(&[
        ("0.0.0.0:80", "Address already in use (os error 98)", false),
        ("0.0.0.0:81", "Address already in use (os error 98)", false),
    ]);
    assert_eq!(
        programmed(&status, None).1,
        "Pending",
        "{:?}",
        programmed(&status, None)
    );
    assert_eq!(programmed(&status, None).0, "False");
}

#[test]
fn an_address_the_host_does_not_have_is_not_usable() {
    let status = status_with(&[(
        "0.0.0.0:80",
        "Cannot assign requested address (os error 99)",
        true,
    )]);
    let (s, reason, message) = programmed(&status, Some("web"));
    assert_eq!((s.as_str(), reason.as_str()), ("False", "Invalid"));
    assert!(message.contains("not usable on this host"), "{message}");
    let (s, reason, _) = programmed(&status, None);
    assert_eq!((s.as_str(), reason.as_str()), ("False", "AddressNotUsable"));
}

#[test]
fn a_gateway_whose_data_plane_does_not_serve_is_pending_everywhere() {
    let out = gateway_web_and_admin();
    let why = "no data-plane replica is connected to the control plane".to_string();
    let serving = Serving {
        not_serving: [(ObjectKey::new("default", "gw"), why.clone())].into(),
        ..Serving::default()
    };
    let mut status = out.status;
    serving::apply(&mut status, &out.config, &serving);
    for listener in [None, Some("web"), Some("admin")] {
        let (s, reason, message) = programmed(&status, listener);
        assert_eq!(
            (s.as_str(), reason.as_str(), message.as_str()),
            ("False", "Pending", why.as_str()),
            "{listener:?}"
        );
    }
}

#[test]
fn a_port_traffic_cannot_reach_is_pending_on_its_listeners_only() {
    let out = gateway_web_and_admin();
    let why = "the data-plane Service ns/gh could not be given this port: refused".to_string();
    let serving = Serving {
        // A UDP port 81 is another port: it leaves the HTTP listener on 81 alone.
        unreachable: [
            ((80, gatehouse_ir::Transport::Tcp), why.clone()),
            ((81, gatehouse_ir::Transport::Udp), why.clone()),
        ]
        .into(),
        ..Serving::default()
    };
    let mut status = out.status;
    serving::apply(&mut status, &out.config, &serving);
    let expected = format!("{why}; retrying");
    assert_eq!(
        programmed(&status, Some("web")),
        ("False".into(), "Pending".into(), expected.clone())
    );
    assert_eq!(programmed(&status, Some("admin")).0, "True");
    let (s, _, message) = programmed(&status, None);
    assert_eq!(s, "True", "the Gateway still serves on its other listener");
    assert_eq!(message, format!("1 of 2 listeners programmed; {expected}"));
}
