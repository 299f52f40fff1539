//! The HTTP/1 response head parser, the framing it derives, and the body decoder. The same
//! bytes also go to the parser of an ExternalAuth server's gRPC answer, another answer from a
//! server the gateway does not control (one target fewer to build in CI).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (head_request, data) = match data.split_first() {
        Some((flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    gatehouse_dataplane::fuzzing::h1_response(data, head_request);
    gatehouse_dataplane::fuzzing::ext_auth_answer(data);
});
