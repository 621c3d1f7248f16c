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
