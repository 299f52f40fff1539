//! The HTTP/1 response head parser, the framing it derives, and the body decoder.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (head_request, data) = match data.split_first() {
        Some((flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    gatehouse_dataplane::fuzzing::h1_response(data, head_request);
});
