//! 100 MB uploads and downloads stream through the gateway in bounded memory.
//! Its own test binary (own process) so the peak-RSS reading sees only this test.

mod support;

use bytes::Bytes;
use futures_util::stream;
use support::*;

const CHUNK_SIZE: usize = 64 * 1024;
const TOTAL: usize = 100 * 1024 * 1024;
static CHUNK: [u8; CHUNK_SIZE] = [b'g'; CHUNK_SIZE];

/// Peak resident set size of this process since the last reset, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

fn current_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_megabytes_each_way_in_bounded_memory() {
    let backend = echo("bulk").await;
    let port = free_port();
    let gw = Gateway::start(&[
        ("gateway.yaml", gateway(&[("http", port)])),
        ("backends.yaml", service("bulk", &[backend], None)),
        (
            "routes.yaml",
            route("bulk", "  rules: [{backendRefs: [{name: bulk, port: 80}]}]"),
        ),
    ])
    .await;
    let c = client();
    // Warm up connections and allocator arenas so they do not count as growth.
    for _ in 0..5 {
        c.post(url(port, "/warm"))
            .body(vec![0u8; 1 << 20])
            .send()
            .await
            .unwrap();
    }

    reset_peak_rss();
    let base = current_rss();
    let chunks = stream::iter(
        (0..TOTAL / CHUNK_SIZE).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(&CHUNK))),
    );
    let resp = c
        .post(url(port, "/upload"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        echo_json(resp).await["body_bytes"],
        TOTAL as u64,
        "every byte arrived"
    );
    let upload_growth = peak_rss().saturating_sub(base);

    reset_peak_rss();
    let base = current_rss();
    let mut resp = c
        .get(url(port, "/download"))
        .header("x-echo-response-bytes", TOTAL.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut received = 0usize;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        received += chunk.len();
    }
    assert_eq!(received, TOTAL);
    let download_growth = peak_rss().saturating_sub(base);

    eprintln!(
        "peak RSS growth: upload {:.1} MiB, download {:.1} MiB (for 100 MiB each way)",
        upload_growth as f64 / 1048576.0,
        download_growth as f64 / 1048576.0
    );
    // Client, gateway and backend share this process: buffering the body anywhere would add
    // at least 100 MiB.
    let limit = 32 * 1024 * 1024;
    assert!(
        upload_growth < limit,
        "upload grew RSS by {upload_growth} bytes"
    );
    assert!(
        download_growth < limit,
        "download grew RSS by {download_growth} bytes"
    );
    gw.stop().await;
}
