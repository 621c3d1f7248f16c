//! The long explanations (`estc explain CODE`) of the codes a run reports (`E09xx`,
//! `W09xx`): checkpoints, input data, model directories, devices, export, ranks. The table
//! in `codes.rs` ties each to its code.

pub const E0901: &str =
    "`model_dir` holds a checkpoint whose variables differ from the program's: a variable is
missing, extra, or has another shape or dtype. The message names each one. est refuses
to resume from it rather than train a model that silently started from scratch.

Use a fresh `--model-dir`, or restore the program the checkpoint was written by.";

pub const E0902: &str =
    "Training stopped because a step met a NaN or an infinite value: the loss, the gradient
of a variable, or the new value of a variable (or optimiser slot). Every op propagates
NaN as IEEE 754 and NumPy do, so one NaN in the input reaches the loss instead of
disappearing. The step is not applied, so no checkpoint ever holds a NaN or an
infinity.

The message names the value, the variable and the step. The help says what was checked
of the last checkpoint: it holds only finite values (checked every step before it was
saved, and when it was restored), with its largest weight, since finite weights may
still be diverging.

Lower the learning rate, clip gradients (`clip_by_global_norm(opt, 1.0)`), or look for NaN and
infinite values in the input (`estc perf-input --show N` prints batches); then train
again, which resumes from the last checkpoint.";

pub const E0903: &str =
    "On the wafer a loop of `iterations_per_loop` steps runs on the device without a round
trip to the host, so a hook cannot run between steps (the TPU Estimator refuses hooks
for the same reason). Register hooks with the interp or host targets, or use summaries
and checkpoints, which run at loop boundaries.";

pub const E0904: &str =
    "A file the run needs could not be read or written: a data file of the input pipeline,
a checkpoint, a summary or a prediction output. The message names the file and the
operating system's reason. Nothing already saved is touched.";

pub const E0905: &str =
    "The input pipeline read a record it cannot use: a CSV row with the wrong number of
fields, a value that does not parse as the column's type, a byte string of the wrong
length for `decode_raw`. The message names the file and the record.";

pub const E0906: &str =
    "An op met a value it cannot compute with: an index out of range in `gather`, an integer
division by zero. The message names the op and where it comes from in the program.";

pub const E0907: &str =
    "The eval input repeats forever and no number of eval steps is given, so evaluation
would never end. Give `eval_steps` in the estimator (or `--steps` on the command line),
or remove the `repeat` from the eval input.";

pub const E0908: &str =
    "`estc train`, `eval` and `predict` run on the reference interpreter (`--target interp`),
on the host (`--target host`, through LLVM) and on the simulated wafer (`--target
wafer`). An estc built without the `llvm` cargo feature cannot run the host target
(rebuild with `--features llvm`).";

pub const E0909: &str =
    "A training run holds an exclusive lock on its `model_dir` (`flock` on `.est.lock`, which
names the holder's PID), so that two runs never overwrite each other's checkpoints. The
kernel releases the lock when the run exits, however it exits, so the lock of a crashed
run is taken over by the next one. `estc eval` and `estc predict` take no lock and may
run alongside training.

Wait for the other run to finish, or train in another `--model-dir`.";

pub const W0910: &str =
    "A checkpoint in `model_dir` is damaged: its metadata is not valid JSON, does not match
its own checksum or is inconsistent (a `global_step` other than the file's step, a
negative step, an `input_position` beyond what the steps could have read), its tensors
file is missing, or a tensor does not match its CRC32C checksum. The run goes on from
the newest intact checkpoint, and the message names both. A training run moves the
damaged files aside (`ckpt-N.json.damaged`, `ckpt-N.safetensors.damaged`), where no run
reads or prunes them; `eval` and `predict` leave them in place.";

pub const E0911: &str =
    "`estc eval` and `estc predict` need a checkpoint: evaluating untrained weights would
print numbers that mean nothing. Or every checkpoint in `model_dir` is damaged (each
named with why), and training will not silently start over beside them.

Train first (`estc train`), point `--model-dir` at a training run's directory, or train
from scratch in a fresh `--model-dir`.";

pub const E0912: &str =
    "`model_dir` holds files of another framework's checkpoints: TensorFlow's (`checkpoint`,
`ckpt-N.index`, `ckpt-N.data-00000-of-00001`, `saved_model.pb`), Keras's (`.h5`,
`.keras`) or PyTorch's (`.pt`, `.pth`). est cannot read them, and would otherwise treat
the directory as empty and write its own checkpoints beside them. Use a fresh
`--model-dir`.";

pub const E0913: &str =
    "An evaluation (or prediction) ran over no batch: `--steps 0`, or an input whose files
are empty or whose filters drop every element. Its metrics
would be meaningless (an accuracy of 0 over nothing), so nothing is reported and
nothing is written: no summary, no prediction file.";

pub const W0914: &str =
    "The TensorBoard summaries of an evaluation could not be written in `model_dir/eval`
(a read-only directory, a full disk). The evaluation's metrics are reported all the
same; only TensorBoard will not see them.";

pub const E0915: &str =
    "A class label is outside `[0, classes)`: where a loss takes the labels through
`one_hot` (the integer-label path of `softmax_cross_entropy`, or a `one_hot` of the
labels in the program), or where `accuracy` compares them with an `argmax` over the
classes. A `one_hot` of such a label is a row of zeros, so the loss would silently
train on nothing for that example (TensorFlow's sparse losses raise here too). The
message names the step (or eval batch), the label and its position in the batch. Only
values computed from the model's labels are checked: a `one_hot` of a feature keeps
TensorFlow's rows of zeros (`one_hot(ids - 1, n)` of ids padded with 0).

Fix the data or the `map` that makes the labels (labels counted from 1 need `- 1`),
or give the model as many classes as the labels need.";

pub const E0916: &str =
    "The eval or predict input ended with a partial batch, and the graph has outputs that a
padded batch would change (each was W0513 at check time: a loss that is not a mean over
the examples, a metric fed one value per batch, a value that mixes the examples). The
run stops rather than report a number that depends on the batch size. Write those
outputs per example (or the loss as a mean), or drop the partial batch with
`batch(n, drop_remainder: true)`.";

pub const E0917: &str =
    "Compiling a graph for the host target (LLVM 19, `--target host`) failed: LLVM has no
code generator for this CPU, rejected the IR it was given, or could not link the
machine code into the process. The message says which. This is a problem of est or of
the machine, not of the program: run the program with `--target interp` meanwhile, and
report the message.";

pub const E0918: &str =
    "`estc build --lib` writes the predict graph as a shared library and a C header, which
run without est. Building one failed: the graph has an op that the library has no
standalone kernel for (the message names it: random numbers, or average pooling or a
convolution computed in f16 or bf16), a variable of a dtype its checkpoint loader
cannot read (f16 and bf16), an input of byte strings, or the C compiler that
links the library (`cc`, or the one `CC` names) is missing or failed (its output is in
the message). Serve such a model from est itself (`estc predict`) meanwhile.";

pub const E0919: &str =
    "`estc build --cpu NAME` generates code for a named CPU (`x86-64-v3`, `znver4`,
`skylake-avx512`) instead of this machine's. LLVM 19 does
not know the name given, and would otherwise have gone on silently with a generic
CPU. `llc-19 -mcpu=help` lists the names it knows (every x86-64 processor and the
levels `x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`); leave `--cpu` out for this
machine's own.";

pub const E0920: &str =
    "`estc sim FILE.estw` runs a program laid out for the wafer by `estc build --target
wafer -o FILE.estw`. The file could not be run: it cannot be read, it is not such an
artifact (another file, or one damaged: cut short, edited), it was written by another
version of the format, or it was compiled for another fabric than the one it is to
run on (the message names both: an artifact places every kernel for one fabric's
size, memory and colours). Rebuild it for the fabric you run it on:

    estc build model.est --target wafer --wafer wse2 -o model.estw
    estc sim model.estw --wafer wse2";

pub const E0921: &str = "An estimator's `warm_start_from` starts a fresh run's variables from another run's
checkpoint (TensorFlow's `WarmStartSettings`), for fine-tuning from pre-trained weights.
It failed: the checkpoint cannot be found or read, or a variable to warm-start is not
in it (under its name, or the name `rename` maps it to), or it is there with another
shape or dtype. The message names the variable. Nothing is trained and nothing is
written to the model directory.

    warm_start_from = warm_start(\"../pretrained\", rename: [(\"classifier/kernel\", \"head/kernel\")])

Map the variable to its name in the checkpoint with `rename`, leave it to its
initialiser with `skip: [\"classifier\"]` (a new head), or restrict the warm start to
some variables with `vars: \"encoder\"`.";

pub const E0922: &str = "`estc export --format onnx` writes the predict graph as an ONNX model whose batch size
is symbolic, so that it serves any batch. The graph has something that ONNX form would
get wrong, and the message names the op and where the program made it:

- an op with no place in a served model: random numbers (dropout or noise left on in
  predict), input-pipeline ops (decoding, vocabulary lookups), gradients;
- a value of f16, bf16 or byte strings (onnxruntime's CPU provider computes few ops in
  f16, so its results would not match est's);
- a value whose shape fixes the batch size: a value with the static batch size written
  in its shape meeting the batch, a reshape, concatenation or slice that mixes the
  batch with other axes, or a prediction without one row per example;
- an op that makes an example's result depend on the other examples of its batch (a
  reduction, softmax or matrix product over the batch axis), which a served batch of
  another size would change;
- u8 arithmetic or orderings of booleans, which onnxruntime has no kernels for.

Compute such values from the features or from constants (`x * 0.0` and `zeros([B, 10])`
follow the batch; a variable of shape `[32, 10]` does not), compute each prediction from its own example,
keep the batch as one leading axis, and keep randomness to training (`if mode ==
train`). `estc export --format native` writes the
model at its static batch size instead.";

pub const E0923: &str =
    "`estc export --verify` runs the exported model with onnxruntime on the first batches of
the eval input, at the model's batch size and at a smaller one, and compares its
outputs with est's predictions. It failed: onnxruntime is not installed for the Python
it ran (`EST_PYTHON`, else `bench/.venv/bin/python` under the working directory, else
`python3`), the ONNX checker refused the file, onnxruntime could not load or run it,
or an output differs from est's by more than the tolerance (1e-5 relative to the
output's largest value); or the verifier did not finish within `EST_VERIFY_TIMEOUT`
seconds (default 300), its answer did not compare every output at both batch sizes, or
the input gave no batch to compare. The message says which; the file is written all
the same.

    bench/.venv/bin/pip install onnxruntime==1.31.1 onnx==1.23.2

A difference is a bug of est's export: report it with the program.";

pub const E0924: &str =
    "In a run across ranks (`mpirun -n N estc train`), every rank takes part in each train
step, evaluation batch and restore. One rank failed (its input could not be read, an
op failed on its batch, rank 0 could not restore the model, or a rank was at another
point of the run), so the others stop at the same step instead of waiting for it. The
failing rank prints its own diagnostic, which says why; rank 0 saves the last complete
step as a checkpoint when it can, so running the same command again resumes from it.

A rank that dies outright (killed, out of memory) takes the job down through `mpirun`,
which names it; the ranks still running say that they were stopped.";

pub const E0925: &str = "Every rank of a run across ranks must run the same estimator of the same program: the
same files and params, `--config` overrides, target and version of est, checked for the
same number of ranks, on the same data (the files of the train, eval and predict inputs:
their paths and sizes, and a checksum of the ends of the first files of each source). The ranks compare
all of this when they start, and refuse to run when they differ, since their gradients
would not be of one model and their evaluations not of one set. The message names the
rank and what differs.

Start every rank from one command line (`mpirun -n 4 estc train model.est`) with
identical copies of the files on every machine.";
