//! TFRecord framing: any bytes either read as records or give a FrameError; never a
//! panic, and never an allocation larger than the input.
#![no_main]
use est::data::records::RecordReader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = RecordReader::new(data, data.len() as u64);
    let mut rec = Vec::new();
    for _ in 0..10_000 {
        match r.next_into(&mut rec) {
            Ok(true) => assert!(rec.len() <= data.len()),
            Ok(false) => break,
            Err(e) if e.resumable() => continue,
            Err(_) => break,
        }
    }
    let _ = est::data::records::unframe(data);
});
