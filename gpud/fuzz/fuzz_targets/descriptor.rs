#![no_main]
//! `cargo +nightly fuzz run descriptor`: see gpud_fuzz::descriptor for what is checked.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpud_fuzz::descriptor::run(data));
