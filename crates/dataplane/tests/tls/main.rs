//! TLS end to end over real sockets and real handshakes: certificates made at test time with
//! rcgen (a private CA, leaves, client certificates), a rustls client, `openssl s_client` where
//! it is installed, and small backends (HTTP, HTTPS, TLS echo, TCP echo).
//!
//! One test binary; a module per topic.

#[path = "../common/mod.rs"]
mod common;
mod support;

mod backend_tls;
mod certificates;
mod client_auth;
mod handshake;
mod resumption;
mod sni;
mod tls_route;
