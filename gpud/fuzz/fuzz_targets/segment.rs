#![no_main]
//! `cargo +nightly fuzz run segment`: see gpud_fuzz::segment for what is checked.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gpud_fuzz::segment::run(data));
