//! Path normalisation: refused, left alone, or rewritten into a stable normal form.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| {
    gatehouse_dataplane::fuzzing::path(data);
});
