//! HTTP/2 keep-alive, the same on both ends: a PING every `INTERVAL` on an otherwise quiet
//! connection, and the connection is given up when no answer came within `TIMEOUT`, so a
//! dead peer (a node that vanished, a dropped NAT entry) is noticed within about 20 s.

use std::time::Duration;

pub(crate) const INTERVAL: Duration = Duration::from_secs(10);
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
