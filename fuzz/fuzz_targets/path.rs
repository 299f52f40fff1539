//! Path normalisation: refused, left alone, or rewritten into a stable normal form. The same
//! input also goes to the `grpc-timeout` parser, another short field from the wire (one
//! target fewer to build in CI).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| {
    gatehouse_dataplane::fuzzing::path(data);
    gatehouse_dataplane::fuzzing::grpc_timeout(data.as_bytes());
});
