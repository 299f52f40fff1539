//! The messages of Envoy's `envoy.service.auth.v3.Authorization/Check`, as prost structs
//! written by hand: only the fields Gatehouse sends or reads, under the field numbers of
//! `envoy/service/auth/v3/{external_auth,attribute_context}.proto` and the messages they
//! import (`envoy.config.core.v3`, `envoy.type.v3`, `google.rpc`, `google.protobuf`). Fields
//! left out are skipped by prost when a server sends them.

use std::collections::BTreeMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckRequest {
    #[prost(message, optional, tag = "1")]
    pub attributes: Option<AttributeContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeContext {
    #[prost(message, optional, tag = "1")]
    pub source: Option<Peer>,
    #[prost(message, optional, tag = "2")]
    pub destination: Option<Peer>,
    #[prost(message, optional, tag = "4")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Peer {
    /// `envoy.config.core.v3.Address`.
    #[prost(message, optional, tag = "1")]
    pub address: Option<Address>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    #[prost(message, optional, tag = "1")]
    pub socket_address: Option<SocketAddress>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SocketAddress {
    #[prost(string, tag = "2")]
    pub address: String,
    #[prost(uint32, tag = "3")]
    pub port_value: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(message, optional, tag = "1")]
    pub time: Option<Timestamp>,
    #[prost(message, optional, tag = "2")]
    pub http: Option<HttpRequest>,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpRequest {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub method: String,
    /// Lower-case names; values of a repeated field joined with `,`.
    #[prost(btree_map = "string, string", tag = "3")]
    pub headers: BTreeMap<String, String>,
    /// The request target: path and query.
    #[prost(string, tag = "4")]
    pub path: String,
    #[prost(string, tag = "5")]
    pub host: String,
    #[prost(string, tag = "6")]
    pub scheme: String,
    /// -1 when unknown.
    #[prost(int64, tag = "9")]
    pub size: i64,
    #[prost(string, tag = "10")]
    pub protocol: String,
    /// The body forwarded, when it is UTF-8; otherwise `raw_body`.
    #[prost(string, tag = "11")]
    pub body: String,
    #[prost(bytes = "vec", tag = "12")]
    pub raw_body: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckResponse {
    /// `google.rpc.Status`: code 0 allows.
    #[prost(message, optional, tag = "1")]
    pub status: Option<RpcStatus>,
    /// One of `denied_response` and `ok_response` (a oneof on the wire).
    #[prost(message, optional, tag = "2")]
    pub denied_response: Option<DeniedHttpResponse>,
    #[prost(message, optional, tag = "3")]
    pub ok_response: Option<OkHttpResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeniedHttpResponse {
    /// `envoy.type.v3.HttpStatus`; unset (or 0): 403.
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    #[prost(string, tag = "3")]
    pub body: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    /// The `StatusCode` enum, whose values are the HTTP status numbers.
    #[prost(int32, tag = "1")]
    pub code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OkHttpResponse {
    /// Set on the request (appended when `append` is true).
    #[prost(message, repeated, tag = "2")]
    pub headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "5")]
    pub headers_to_remove: Vec<String>,
}

/// `envoy.config.core.v3.HeaderValueOption`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    /// `google.protobuf.BoolValue`: in ext_authz responses, unset means replace.
    #[prost(message, optional, tag = "2")]
    pub append: Option<BoolValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    /// Used instead of `value` when not empty.
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}
