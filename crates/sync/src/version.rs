//! Snapshot versions derived from content.
//!
//! A version is a hash of the snapshot's JSON, not a counter: a control plane that restarts
//! (or another replica that becomes leader) gives the same configuration the same version,
//! so a data plane that already serves it is not sent it again. serde_json writes an
//! `ir::Config` deterministically (it holds only structs and sorted `Vec`s, no maps).

use aws_lc_rs::digest;
use gatehouse_ir as ir;

/// The JSON of `config` and its version.
pub fn encode(config: &ir::Config) -> (Vec<u8>, String) {
    // `ir::Config` is plain data with string keys: serialising it cannot fail.
    let json = serde_json::to_vec(config).expect("ir::Config serialises to JSON");
    let version = version_of(&json);
    (json, version)
}

/// `sha256:` and the first 128 bits of the SHA-256 of `config_json`, in hex: collisions are
/// out of reach even for a user who crafts routes on purpose.
pub fn version_of(config_json: &[u8]) -> String {
    let hash = digest::digest(&digest::SHA256, config_json);
    let mut version = String::from("sha256:");
    for byte in &hash.as_ref()[..16] {
        version.push_str(&format!("{byte:02x}"));
    }
    version
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_content_has_equal_versions() {
        let mut config = ir::Config::default();
        let (json, version) = encode(&config);
        assert_eq!(version, version_of(&json));
        assert_eq!(version.len(), "sha256:".len() + 32);
        assert_eq!(encode(&config.clone()).1, version);
        config.gateways.push(ir::Gateway {
            namespace: "apps".into(),
            name: "public".into(),
            listeners: Vec::new(),
        });
        assert_ne!(encode(&config).1, version);
    }
}
