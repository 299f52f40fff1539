//! Logging setup.

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Install the global tracing subscriber. `RUST_LOG` overrides `default_level`.
pub fn init_logging(format: LogFormat, default_level: &str) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // rustls warns about things clients do on every connection (an IP address as SNI, for
    // one): any client could fill the log and spend the proxy's CPU on it. Gatehouse reports
    // handshake failures itself (metrics, debug logs); rustls keeps its errors unless
    // RUST_LOG names it.
    if !std::env::var("RUST_LOG").is_ok_and(|v| v.contains("rustls")) {
        filter = filter.add_directive("rustls=error".parse().expect("static directive"));
    }
    // Colour only on a terminal: logs redirected to files or collected by a node agent
    // should not carry escape codes.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
