//! MNIST-shaped TFRecord data for the tests and benches that train the MNIST examples
//! (included with `#[path]`, so that `tests/host.rs` and `benches/train.rs` write the
//! same records).

use std::path::Path;

/// `records` MNIST-shaped tf.Examples (pseudo-random pixels from a fixed xorshift,
/// labels cycling through the 10 classes) as `data/mnist_{train,test}.tfrecord` under
/// `dir`, the paths the MNIST examples read.
pub fn write(dir: &Path, records: u32) {
    use est::data::records::{encode_example, frame, Feature};
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let mut file = Vec::new();
    let mut x: u32 = 12345;
    for i in 0..records {
        let img: Vec<u8> = (0..784)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        let label = [i64::from(i % 10)];
        file.extend(frame(&encode_example(&[
            ("image_raw", Feature::Bytes(&img)),
            ("label", Feature::Ints(&label)),
        ])));
    }
    std::fs::write(dir.join("data/mnist_train.tfrecord"), &file).unwrap();
    std::fs::write(dir.join("data/mnist_test.tfrecord"), &file).unwrap();
}

/// A copy of example `program` (in `data`) whose train input is what the peers train
/// on: a pool of 10 batches, already in memory, served in turn (the example's input
/// decodes the TFRecord file, caches the rows and shuffles them through a 10,000-row
/// buffer, stacking every batch anew).
#[allow(dead_code)] // (the benches use it)
pub fn in_memory(program: &Path, data: &Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(program).unwrap();
    let shuffled = "    |> cache\n    |> shuffle(10_000)\n    |> repeat\n    \
                    |> batch(params.batch_size, drop_remainder: true)\n";
    let pool = "    |> batch(params.batch_size, drop_remainder: true)\n    |> take(10)\n    \
                |> cache\n    |> repeat\n";
    assert!(
        text.contains(shuffled),
        "{} no longer ends its input as the bench expects",
        program.display()
    );
    let copy = data.join(program.file_name().unwrap());
    std::fs::write(&copy, text.replace(shuffled, pool)).unwrap();
    copy
}
