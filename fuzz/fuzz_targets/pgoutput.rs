//! Fuzzes the pgoutput protocol-v1 decoder with arbitrary bytes: it must
//! never panic, and a message it accepts must be exactly delimited.

#![no_main]

use datum::decode_pgoutput as decode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(message) => {
            // Every pgoutput message is self-delimiting: dropping its last
            // byte or adding one must be an error.
            if let Some((_, shorter)) = data.split_last() {
                assert!(decode(shorter).is_err(), "prefix accepted: {message:?}");
            }
            let mut longer = data.to_vec();
            longer.push(0);
            assert!(
                decode(&longer).is_err(),
                "trailing byte accepted: {message:?}"
            );
        }
        Err(error) => {
            // Formatting the error must not panic either.
            let _ = error.to_string();
        }
    }
});
