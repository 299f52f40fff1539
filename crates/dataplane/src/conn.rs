//! What every request of a client connection shares, whichever path serves it (the HTTP/1
//! path in `h1`, hyper's in `hyper_path`): the connection's context and the routing prologue.

use crate::headers::RequestHeaders;
use crate::listeners::{ActiveConn, SocketShared};
use crate::matchers::RequestView;
use crate::router::{self, Refusal, Routed};
use crate::table::{CompiledListener, SocketTable};
use http::HeaderValue;
use std::sync::Arc;

/// One client connection, shared by its requests (and by an upgraded tunnel, which keeps the
/// connection counted as active until it closes).
pub(crate) struct ConnContext {
    pub socket: Arc<SocketShared>,
    /// The client IP, formatted once per connection for `X-Forwarded-For`.
    pub client_ip: HeaderValue,
    /// TLS connections: the SNI name (lower case, empty when the client sent none) that chose
    /// the listener whose certificate the connection got.
    pub sni: Option<Box<str>>,
    /// `X-Forwarded-Proto`.
    pub proto: HeaderValue,
    _active: ActiveConn,
}

impl ConnContext {
    pub(crate) fn new(
        socket: Arc<SocketShared>,
        client_ip: HeaderValue,
        sni: Option<Box<str>>,
        active: ActiveConn,
    ) -> Self {
        let proto = HeaderValue::from_static(if sni.is_some() { "https" } else { "http" });
        ConnContext {
            socket,
            client_ip,
            sni,
            proto,
            _active: active,
        }
    }

    /// The prologue of every request: host → listener → 421 when, on TLS, the Host belongs to
    /// another listener than the one the SNI chose (whose certificate the client got) → the
    /// first matching route of the listener's virtual host. `host` must be normalised
    /// ([`router::normalize_host`]).
    #[inline]
    /// The listener a request with this host belongs to, as [`ConnContext::route`] chooses
    /// it; `None` when none does (or the host is not the one the TLS server name chose).
    pub(crate) fn listener<'t>(
        &self,
        table: &'t SocketTable,
        host: &str,
    ) -> Option<&'t CompiledListener> {
        let index = table.hosts.get(host).copied()?;
        if let Some(sni) = self.sni.as_deref()
            && table.hosts.get(sni).copied() != Some(index)
        {
            return None;
        }
        table.listeners.get(index)
    }

    pub(crate) fn route<'t, H: RequestHeaders + ?Sized>(
        &self,
        table: &'t SocketTable,
        host: &str,
        req: &mut RequestView<'_, H>,
    ) -> Routed<'t> {
        let listener = table.hosts.get(host).copied();
        if let (Some(sni), Some(by_host)) = (self.sni.as_deref(), listener)
            && table.hosts.get(sni).copied() != Some(by_host)
        {
            return Routed::Refused(Refusal::misdirected(table));
        }
        router::route(table, listener, host, req)
    }
}
