#![no_main]
//! `cargo +nightly fuzz run ring`: see gpud_fuzz::ring for what is checked.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpud_fuzz::ring::run(data));
