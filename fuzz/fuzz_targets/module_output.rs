//! Fuzzes the reader of module output (`datum_guest::wire`) with arbitrary
//! bytes, as a hostile module could write them: it must never panic, and
//! whatever the direct reader accepts, `rmp-serde` must read the same.

#![no_main]

use datum_guest::wire::{self, Change, Envelope};
use libfuzzer_sys::fuzz_target;

fn encoded<T: serde::Serialize>(value: &T) -> Vec<u8> {
    wire::to_msgpack(value).expect("a decoded value encodes")
}

fuzz_target!(|data: &[u8]| {
    // The direct reader keeps each row's bytes and decodes them when first
    // read: encoding the output reads every row, and a row that does not
    // decode is the direct reader's refusal.
    if let Ok(outputs) = wire::decode_changes_envelope(data.to_vec())
        && let Ok(direct) = wire::to_msgpack(&outputs)
    {
        match wire::from_msgpack::<Envelope>(data) {
            Ok(Envelope::Changes { changes }) => {
                assert_eq!(encoded(&changes), direct, "the readers disagree")
            }
            other => panic!("read directly, but rmp-serde says {other:?}"),
        }
    }
    if let Ok(change) = wire::decode_change(data) {
        let by_serde: Change = wire::from_msgpack(data).expect("rmp-serde reads it too");
        assert_eq!(encoded(&change), encoded(&by_serde), "the readers disagree");
    }
});
