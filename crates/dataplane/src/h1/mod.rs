//! The HTTP/1.1 request path: client connection and pooled upstream connection driven from the
//! connection's own task, heads parsed with httparse into reused buffers, bodies streamed with
//! their framing re-encoded.
//!
//! Why not hyper here: a hyper server plus hyper-util's pooled client parse every head into a
//! `HeaderMap`, serialise it again, and hand each request to a separate connection task over a
//! channel. Profiles put that at twice nginx's user-space CPU per proxied request. This path
//! does the same work with one parse per head, no per-request allocation and no task switch.
//! Everything it does not handle (HTTP/2, protocol upgrades, unusual request targets, h2c
//! backends) is handed to the hyper path with the bytes read so far, so both paths share one
//! router, one set of filters and one set of tests.

pub(crate) mod body;
mod buf;
pub(crate) mod client;
mod date;
mod deadline;
pub(crate) mod parse;
mod pool;
mod session;
mod write;

pub(crate) use pool::Pool;
pub(crate) use pool::set_worker_index;
pub(crate) use session::{H2_PREFACE, Outcome, Settings, serve};
