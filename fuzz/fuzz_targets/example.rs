//! tf.Example parsing: any bytes parse into the requested features or give an error
//! message; never a panic.
#![no_main]
use est::ir::DType;
use est::data::records::parse_example;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let schemas: [&[(&str, DType, &[usize])]; 4] = [
        &[("image_raw", DType::Bytes, &[]), ("label", DType::I32, &[])],
        &[("x", DType::F32, &[2, 2]), ("y", DType::U8, &[3])],
        &[("a", DType::F16, &[]), ("b", DType::Bool, &[1])],
        &[("s", DType::Bytes, &[]), ("n", DType::I64, &[4])],
    ];
    let want: Vec<(String, DType, Vec<usize>)> = schemas[pick as usize % 4]
        .iter()
        .map(|(n, d, s)| (n.to_string(), *d, s.to_vec()))
        .collect();
    if let Ok(e) = parse_example(rest, &want) {
        assert_eq!(e.len(), want.len());
    }
});
