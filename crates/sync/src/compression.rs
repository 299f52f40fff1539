//! Snapshots compressed once by the control plane (`Snapshot.config_gzip`).
//!
//! gRPC's own compression (tonic's gzip, at level 6) runs per message and per stream: every
//! replica of a Gateway costs the control plane one compression of the same snapshot, on a
//! runtime worker. At 5000 routes the JSON is 1.8 MB and that was 4.7 ms each; at level 1,
//! once per snapshot, it is 0.5 ms for all of them, and 53 KB on the wire instead of 46 KB
//! (`cargo run --release -p gatehouse-sync --example snapshot_codec`). `flate2` is the library
//! tonic already uses for gzip.

use flate2::Compression;
use std::io::{Read, Write};

/// `json` gzip-compressed, at level 1: the JSON of a configuration is mostly the same few
/// keys and values again, which even the fastest level takes out.
pub fn gzip(json: &[u8]) -> Vec<u8> {
    let mut encoder =
        flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 16), Compression::fast());
    // Writing into a `Vec` cannot fail.
    encoder.write_all(json).expect("gzip into memory");
    encoder.finish().expect("gzip into memory")
}

/// The bytes `gzip` compressed, refused past `limit` bytes decompressed (a snapshot that
/// would be larger is not taken, whatever its compressed size) or when it is not gzip.
pub fn gunzip(compressed: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    // No room reserved up front: `read_to_end` grows the buffer as it needs, and reserving a
    // guess (16 times the compressed size) measured slower, not faster.
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the snapshot does not decompress: {e}"))?;
    if out.len() > limit {
        return Err(format!(
            "the snapshot decompresses to more than {limit} bytes"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_compressed_decompresses_to_itself() {
        let json = br#"{"gateways":[],"clusters":[],"certificates":[]}"#.repeat(100);
        let compressed = gzip(&json);
        assert!(
            compressed.len() < json.len() / 10,
            "{} bytes",
            compressed.len()
        );
        assert_eq!(gunzip(&compressed, json.len()).unwrap(), json);
    }

    #[test]
    fn more_than_the_limit_or_not_gzip_is_refused() {
        let json = vec![b' '; 10_000];
        let compressed = gzip(&json);
        let error = gunzip(&compressed, 9_999).unwrap_err();
        assert!(error.contains("more than 9999 bytes"), "{error}");
        let error = gunzip(b"{\"gateways\":[]}", 1 << 20).unwrap_err();
        assert!(error.contains("does not decompress"), "{error}");
        // Cut short: the stream ends before its trailer.
        let error = gunzip(&compressed[..compressed.len() - 4], 1 << 20).unwrap_err();
        assert!(error.contains("does not decompress"), "{error}");
    }
}
