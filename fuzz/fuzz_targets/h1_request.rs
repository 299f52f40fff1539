//! The HTTP/1 request head parser and body decoder, differentially against httparse and an
//! independent reading of RFC 9112's framing rules (see `gatehouse_dataplane::fuzzing`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gatehouse_dataplane::fuzzing::h1_request(data);
});
