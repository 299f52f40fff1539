//! translate from arbitrary Gateway API objects: whatever YAML documents the input holds,
//! read into every registered kind that accepts them, translate must not panic, must give the
//! same output twice, and every IR it produces must compile in the data plane's matchers (a
//! regex translate accepts is one the data plane can build).
#![no_main]
use gatehouse_translate::{Input, Options, translate};
use serde::Deserialize;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut input = Input::default();
    for doc in serde_yaml::Deserializer::from_str(text).take(32) {
        let Ok(value) = serde_yaml::Value::deserialize(doc) else {
            return;
        };
        // Unknown kinds and objects that do not fit their kind are skipped, as the
        // manifest reader and the API server would refuse them.
        let _ = gatehouse_testkit::manifests::try_push(&mut input, value);
    }
    let first = translate(&input, &Options::default());
    let second = translate(&input, &Options::default());
    assert_eq!(first, second, "translate is deterministic");
    gatehouse_dataplane::fuzzing::compiles(&first.config);
});
