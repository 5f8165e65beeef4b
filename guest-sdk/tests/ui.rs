//! Compile-pass and compile-fail cases for the attributes of
//! `datum-guest-macros`: each `fail/*.rs` has its expected message in
//! `fail/*.stderr` (regenerate with `TRYBUILD=overwrite cargo test -p
//! datum-guest --test ui`, then read them).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
