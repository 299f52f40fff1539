//! The committed `sync.proto` documents the hand-written prost structs (`src/wire.rs`): every
//! field the `.proto` declares is encoded by the structs with the same number and wire type,
//! and the structs encode nothing the `.proto` does not declare.

use bytes::Bytes;
use gatehouse_sync::wire::*;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};

/// (field number, wire type): 0 varint, 2 length-delimited.
type Fields = BTreeSet<(u32, u8)>;

/// Reads the fields of every message of the `.proto`, oneof members included.
fn proto_fields() -> BTreeMap<String, Fields> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/proto/gatehouse/sync/v1/sync.proto"
    ))
    .unwrap();
    let mut messages: BTreeMap<String, Fields> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("message ") {
            let name = rest.trim_end_matches('{').trim().to_string();
            messages.insert(name.clone(), Fields::new());
            current = Some(name);
            continue;
        }
        // A field belongs to the last `message` opened: a oneof's members are the message's
        // fields, and nothing but fields has an `=` inside a message.
        let Some(message) = &current else { continue };
        let Some((declaration, number)) = line.trim_end_matches(';').split_once('=') else {
            continue;
        };
        let words: Vec<&str> = declaration.split_whitespace().collect();
        let ty = match words.as_slice() {
            ["repeated", ty, _name] | [ty, _name] => *ty,
            _ => panic!("unexpected declaration {line:?}"),
        };
        let wire_type = match ty {
            "uint32" | "bool" => 0,
            _ => 2, // string, bytes, messages
        };
        let number: u32 = number.trim().parse().unwrap();
        messages
            .get_mut(message)
            .unwrap()
            .insert((number, wire_type));
    }
    messages
}

/// The top-level (number, wire type) pairs in an encoded message.
fn encoded_fields(encoded: &[u8]) -> Fields {
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = buf[0];
            *buf = &buf[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut buf = encoded;
    let mut fields = Fields::new();
    while !buf.is_empty() {
        let key = varint(&mut buf);
        let (number, wire_type) = ((key >> 3) as u32, (key & 7) as u8);
        match wire_type {
            0 => {
                varint(&mut buf);
            }
            2 => {
                let len = varint(&mut buf) as usize;
                buf = &buf[len..];
            }
            other => panic!("wire type {other} is used by no field of sync.proto"),
        }
        fields.insert((number, wire_type));
    }
    fields
}

fn unbound() -> UnboundListener {
    UnboundListener {
        port: 443,
        error: "in use".into(),
        address_not_usable: true,
        address: "0.0.0.0".into(),
        udp: true,
    }
}

/// Every message with every field set (a oneof once per member).
fn examples() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let hello = Hello {
        pod: "p".into(),
        build: "b".into(),
        current_version: "v".into(),
        gzip_snapshots: true,
    };
    let ack = Ack {
        version: "v".into(),
        unbound: vec![unbound()],
        diagnostics: vec!["d".into()],
    };
    let nack = Nack {
        version: "v".into(),
        error: "e".into(),
    };
    let serving = Serving {
        unbound: vec![unbound()],
    };
    let snapshot = Snapshot {
        version: "v".into(),
        config_json: Bytes::from_static(b"{}"),
        config_gzip: Bytes::from_static(b"\x1f\x8b"),
    };
    let credentials = Credentials {
        cert_pem: "c".into(),
        key_pem: "k".into(),
        ca_pem: "a".into(),
    };
    let data = |kind| DataPlaneMessage { kind: Some(kind) }.encode_to_vec();
    let control = |kind| ControlPlaneMessage { kind: Some(kind) }.encode_to_vec();
    vec![
        (
            "DataPlaneMessage",
            vec![
                data(data_plane_message::Kind::Hello(hello.clone())),
                data(data_plane_message::Kind::Ack(ack.clone())),
                data(data_plane_message::Kind::Nack(nack.clone())),
                data(data_plane_message::Kind::Serving(serving.clone())),
            ],
        ),
        ("Hello", vec![hello.encode_to_vec()]),
        ("Ack", vec![ack.encode_to_vec()]),
        ("Nack", vec![nack.encode_to_vec()]),
        ("Serving", vec![serving.encode_to_vec()]),
        ("UnboundListener", vec![unbound().encode_to_vec()]),
        (
            "ControlPlaneMessage",
            vec![
                control(control_plane_message::Kind::Snapshot(snapshot.clone())),
                control(control_plane_message::Kind::Credentials(
                    credentials.clone(),
                )),
            ],
        ),
        ("Snapshot", vec![snapshot.encode_to_vec()]),
        ("Credentials", vec![credentials.encode_to_vec()]),
    ]
}

#[test]
fn the_proto_file_describes_the_structs() {
    let proto = proto_fields();
    let examples = examples();
    let documented: BTreeSet<&str> = proto.keys().map(String::as_str).collect();
    let built: BTreeSet<&str> = examples.iter().map(|(name, _)| *name).collect();
    assert_eq!(documented, built, "the same messages on both sides");
    for (name, encodings) in examples {
        let encoded: Fields = encodings.iter().flat_map(|e| encoded_fields(e)).collect();
        assert_eq!(encoded, proto[name], "fields of {name}");
    }
}

#[test]
fn a_snapshot_round_trips() {
    let message = ControlPlaneMessage {
        kind: Some(control_plane_message::Kind::Snapshot(Snapshot {
            version: "sha256:00".into(),
            config_json: Bytes::from_static(br#"{"gateways":[],"clusters":[],"certificates":[]}"#),
            config_gzip: Bytes::new(),
        })),
    };
    let decoded = ControlPlaneMessage::decode(message.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, message);
}
