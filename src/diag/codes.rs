//! The catalogue of diagnostic codes: one row per code with its severity, a title and the
//! long explanation `estc explain CODE` prints. `docs/diagnostics.md` is generated from
//! this table (a test keeps the two in step).

use super::Severity;

/// Facts about one code.
pub struct CodeInfo {
    pub code: Code,
    pub id: &'static str,
    pub severity: Severity,
    pub title: &'static str,
    pub explanation: &'static str,
}

macro_rules! codes {
    ($( $variant:ident = $id:literal, $sev:ident, $title:literal, $expl:literal; )*) => {
        /// A diagnostic code. `E` codes are errors, `W` codes warnings.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code { $($variant),* }

        const TABLE: &[CodeInfo] = &[
            $(CodeInfo { code: Code::$variant, id: $id, severity: Severity::$sev, title: $title, explanation: $expl }),*
        ];
    };
}

impl Code {
    pub fn info(self) -> &'static CodeInfo {
        &TABLE[self as usize]
    }

    pub fn id(self) -> &'static str {
        self.info().id
    }

    pub fn all() -> &'static [CodeInfo] {
        TABLE
    }

    /// Looks a code up by its id, case-insensitively (`e0401`, `E0401`).
    pub fn from_id(id: &str) -> Option<Code> {
        TABLE
            .iter()
            .find(|c| c.id.eq_ignore_ascii_case(id.trim()))
            .map(|c| c.code)
    }
}

codes! {
    SyntaxError = "E0101", Error, "syntax error",
"The parser met a token it did not expect. The message says what it found and what
could have come instead. The parser recovers at the next statement or item, so every
syntax error of a file is reported in one run.

    model m(features: f32[B, 4], labels: i32[B]) {
      let x = dense(features 10)     // error: expected `,` or `)`
    }

Fix the text at the label; the help lists the tokens that would fit.";

    UnexpectedEof = "E0102", Error, "unexpected end of file",
"The file ended while a construct was still open, most often a `{`, `(` or `[` without
its closing partner.

    fn block(x) {
      dense(x, 10)
    // error: the file ends before the `}` of `block`

Close the construct that the label points at.";

    InvalidCharacter = "E0103", Error, "invalid character",
"The lexer found text that is no token of est: a stray character such as `$` or `#`, a
string without its closing quote on the same line, or a block comment `/*` without its
`*/`.

    let x = 3 # comment      // error: `#` starts no token; comments start with `//`

Remove the character, close the string, or write the comment with `//`.";

    InvalidLiteral = "E0104", Error, "invalid literal",
"A number does not fit its type (integers are 64-bit; floats must be finite), or a
string contains an unknown escape. Known escapes are `\\n`, `\\t`, `\\\\`, `\\\"` and
`\\{` (a literal brace in an interpolated string).

    let n = 99999999999999999999   // error: too large for a 64-bit integer

Write a smaller number or a valid escape.";

    UnreadableModule = "E0105", Error, "imported file cannot be read",
"A `use` names a module whose file exists but cannot be read: it is larger than 16 MiB
(the limit of a source file, which keeps `/dev/zero` and other endless files from
being read for ever), it is not UTF-8 text, or reading it failed (a directory, no
permission). The message says which, with the line and byte of the first bad byte
of a file that is not UTF-8.

    use data.weights    // error: cannot read data/weights.est, the file of module
                        // `data.weights`: it is larger than 16 MiB, the limit of a
                        // source file

Split a large module into smaller files, save the file as UTF-8, or fix its
permissions. A root file that cannot be read is not a diagnostic but an error of
`estc` itself (`error: cannot read ...`, exit status 2).";

    UnreadableFile = "E0106", Error, "a file read at compile time cannot be read",
"A file the program reads while it is compiled, such as the vocabulary file of
`lookup`, does not exist, cannot be read, or is not UTF-8 text. Paths are relative to
the directory of the program's root file.

    let ids = lookup(row.workclass, \"vocab/workclas.txt\")   // error: cannot read
                                                              // vocab/workclas.txt

Fix the path, or give the vocabulary as a list of strings.";

    UnknownName = "E0201", Error, "unknown name",
"A name is used that no `let`, parameter, item, import or the prelude defines. The
help suggests a close name when there is one.

    use std.nn.dense
    model m(features: f32[B, 4], labels: i32[B]) {
      let logits = dense(featurs, 3)   // error: unknown name `featurs`
    }

Correct the spelling, import the item with `use`, or define the name first.";

    UnknownModule = "E0202", Error, "unknown module",
"A `use` names a module that does not exist. `std.*` modules come with est (`std.nn`,
`std.losses`, `std.metrics`, `std.optim`, `std.data`, `std.hooks`, `std.prim`); other
paths name files relative to the importing file (`use lib.layers` reads
`lib/layers.est`).

    use std.layers.dense    // error: no module `std.layers`

Use an existing module, or create the file.";

    UnknownItem = "E0203", Error, "unknown item in module",
"A `use` or a qualified name (`nn.dense`) names something the module does not define.

    use std.nn.{dense, conv3d}   // error: `std.nn` has no item `conv3d`

Check the module's items (the help lists close names) or import from the right module.";

    DuplicateDefinition = "E0204", Error, "duplicate definition",
"Two items of a module, two parameters of a function, two fields of a record, of a
`params` block or of an estimator, or two variables of one function call have the same
name; or a program has two `params` blocks. Each must be unique. (Two sections of one
kind in a model are E0310.)

    fn block(x) { x }
    fn block(x) { x }      // error: `block` is defined twice

Rename or remove one of them.";

    UnknownField = "E0205", Error, "unknown field",
"A field is read that the value does not have: a `params` field that is not declared,
a record field that is not there, or a property a tensor does not have (tensors have
`shape`, `dtype` and `rank`).

    params { batch_size: int = 32 }
    ... batch(params.batchsize)    // error: `params` has no field `batchsize`

Declare the field or correct its name.";

    TensorLoopBound = "E0301", Error, "loop bound depends on a tensor",
"`for` loops are unrolled when the program is compiled, so what they iterate over must
be static: a list, a range of static integers, or a params field. A tensor's value is
only known when the model runs.

    for i in 0..argmax(logits, 1) { ... }   // error: the bound is a tensor

Iterate over a static value. To choose between tensors elementwise, use
`where(cond, a, b)`; to repeat a layer, loop over a static count such as a params field.";

    TensorCondition = "E0302", Error, "condition depends on a tensor",
"`if` is resolved when the program is compiled, so its condition must be static: it
may depend on `mode`, `target`, params and other static values, but not on a tensor.

    if reduce_mean(x) > 0.0 { x = relu(x) }    // error: the condition is a tensor

Use `where(cond, a, b)` to choose elementwise between two tensors of the same shape.";

    WrongArity = "E0303", Error, "wrong number of arguments",
"A function is called with too many positional arguments, or without a required one.
The help shows the function's signature.

    fn block(x, units: int) { dense(x, units) }
    ... block(x)          // error: missing argument `units`

A pipeline's `map` passes each element to its closure as one value: a `(features,
labels)` pair is one tuple, which a tuple pattern takes apart.

    ds |> map |x, y| (x / 255.0, y)       // error: the closure takes 2 arguments
    ds |> map |(x, y)| (x / 255.0, y)     // ok

Pass every parameter that has no default, and no more than the function takes.";

    UnknownArgument = "E0304", Error, "unknown named argument",
"A named argument does not match any parameter of the called function, or names a
parameter that was already given positionally.

    conv2d(x, filter: 32, kernel: [5, 5])   // error: no parameter `filter` (did you mean `filters`?)

Use the parameter names of the function's signature.";

    TypeMismatch = "E0305", Error, "wrong kind of value",
"A static value of the wrong kind is used: a string where an integer is expected, a
tensor where a static value is needed (such as a shape or a layer width), or a value
that is not callable is called.

    dense(x, units: \"ten\")    // error: expected an integer, found a string

Pass a value of the expected kind; the label says which one.";

    InvalidParamOverride = "E0306", Error, "invalid params override",
"A `--param key=value` or a `--params FILE.yaml` entry names a field that the `params`
block does not declare, or gives a value that does not parse as the field's type.

    estc check model.est --param learning_rat=0.1   // error: no params field `learning_rat`

Override declared fields only, with values of their declared type (`int`, `float`,
`bool`, `string`, or a list such as `[128, 64]`).";

    RecursionLimit = "E0307", Error, "recursion too deep",
"Functions are inlined when the program is compiled; a function that calls itself
without a static base case never finishes inlining. est stops at 256 nested calls.

    fn f(x) { f(x) }     // error: recursion too deep

Give the recursion a static base case (`if n == 0 { ... }`) or use a `for` loop.";

    StaticEvalError = "E0308", Error, "static evaluation failed",
"A static computation failed while the program was being compiled: a division by zero,
an index out of range, an integer overflow, a range that runs backwards (`3..1`), a
count that must be positive (`shuffle(0)`), a value a library function refuses (for
example a dropout rate outside [0, 1), reported by `static_assert`), or an elaboration
that unrolls too far (more than 20 million steps: graphs of several million nodes).

    let widths = [256, 128]
    let w = widths[2]        // error: index 2 is out of range for a list of 2

Fix the static values involved; the label shows the computation.";

    AssignUndefined = "E0309", Error, "assignment to an undefined name",
"`name = value` updates a variable that an enclosing `let` introduced. Assigning a
name that does not exist yet is an error (it is usually a missing `let` or a typo).

    for u in [64, 64] { y = dense(x, u) }   // error: `y` is not defined

Introduce the variable with `let` first, or fix the name.";

    MisplacedStatement = "E0310", Error, "statement in the wrong place",
"Some statements belong to one place only: `train`, `eval` and `predict` sections to
the top level of a model body; `minimize` to a train section; `metric` to train and
eval sections; a section appears at most once per model.

    fn block(x) { train { minimize x with sgd(lr: 0.1) } }   // error: a section outside a model

Move the statement where it belongs.";

    ShapeMismatch = "E0401", Error, "shape mismatch",
"The shapes of the operands do not fit the operation: elementwise operations need
shapes that broadcast (equal, or 1, aligned from the right), `matmul` needs the inner
dimensions to agree, and so on. Both operands are labelled with their types.

    let y = x + bias     // error: f32[32, 10] and f32[5] do not broadcast

Reshape, transpose or slice one operand, or fix the layer sizes.";

    DtypeMismatch = "E0402", Error, "dtype mismatch",
"The operands have different dtypes, or the operation does not accept this dtype.
est never converts dtypes implicitly; static numbers adopt the dtype of the tensor
they meet.

    let y = cast(labels, f32) + labels     // error: f32 and i32

Convert one side with `cast(x, dtype)`.";

    Int64 = "E0403", Error, "64-bit integers are not supported",
"`i64` tensors are not supported: neither the wafer nor the host backend keeps 64-bit
integers, except for the global step counter. Integer features read from records are
narrowed to i32 at `parse`, with a range check.

    model m(features: f32[B, 4], labels: i64[B])    // error: i64

Use `i32`, or `cast(x, i32)`.";

    InvalidShape = "E0404", Error, "invalid shape",
"A shape argument is not valid: a `reshape` that changes the number of elements, a
negative or zero dimension, more than one `-1`, or a shape that is not a list of
integers.

    reshape(x, [B, 27, 28, 1])     // error: 784 elements cannot become 756

Make the element counts agree.";

    InvalidAxis = "E0405", Error, "invalid axis",
"An axis argument is out of range for the tensor's rank (axes count from 0, negative
axes from the end), or is given twice.

    argmax(logits, 2)     // error: axis 2 of a rank-2 tensor

Use an axis in `-rank..rank`.";

    UnboundDimension = "E0406", Error, "dimension cannot be determined",
"A named dimension in a model's signature (such as `B` in `f32[B, 784]`) is bound by
the input pipeline's element shapes. When the pipeline does not determine it (for
example after `decode_raw` without a length), the model's signature must give it.

    input raw() { text(\"x.txt\") |> map |l| (decode_raw(l, u8), 0) |> batch(8, drop_remainder: true) }
    model m(features: f32[B, N], ...)     // error: N is not determined

Write the dimension as a number in the signature, or give the length to the pipeline.";

    InputModelMismatch = "E0407", Error, "input does not match the model",
"The input pipeline's (features, labels) do not have the dtypes and shapes the model's
parameters declare. Both the model parameter and the pipeline are labelled.

    input d() { ... |> batch(32, drop_remainder: true) }   // yields f32[32, 64]
    model m(features: f32[B, 784], labels: i32[B])        // error: 64 vs 784

Change the model's signature or the pipeline so that they agree.";

    BytesInModel = "E0408", Error, "bytes in a model",
"A model computes with numbers; byte strings are for input pipelines, where `parse`
reads them from records and `decode_raw` turns them into numbers inside a `map`. A
`bytes` tensor in a model graph (from `cast(x, bytes)`, say) has no meaning for any op
or backend.

    predict { raw = cast(logits, bytes) }   // error: bytes in a model

Decode byte strings in the input's `map` and give the model numeric tensors.";
    InputNotDataset = "E0501", Error, "input does not produce the model's (features, labels)",
"An estimator's input must be a dataset. As in TensorFlow, an element that is a pair is
`(features, labels)`, and any other element (a tensor or a record) is the features alone;
features and labels may each be a tensor, a record of tensors or a tuple of them, as the
model's signature declares. Labels are needed only by a model that takes them, and
never in predict mode. A tuple of three or more is neither.

    input d() { range(100) |> map |i| (i, i, i) |> batch(10) }   // error: a tuple of 3
    model m(features: f32[B, 4], labels: i32[B])                   // error if the input yields features only

Make the element a pair with a `map` (`|> map |(a, b, y)| ({ a: a, b: b }, y)`), or drop
the model's labels parameter if it learns from the features alone.";

    BatchNotFixed = "E0502", Error, "batch size is not fixed",
"Every step must see the same batch size, because every tensor has a static shape. A
`batch` without `drop_remainder: true` makes the last batch of an epoch smaller. The
wafer target requires a fixed batch for every input; the host target requires it for the
train input.

    |> batch(params.batch_size)     // error: no drop_remainder

Write `batch(n, drop_remainder: true)`.";

    NoRepeat = "E0503", Error, "training input would run out",
"Training runs for a number of steps, not epochs. A train input without `repeat` ends
after one pass over its data, before the steps are done. The wafer needs samples for
every step, so this is an error there; on the host training simply stops when the input
ends, and nothing is reported.

    input d() { csv(\"x.csv\") |> batch(32, drop_remainder: true) }   // no repeat

Add `|> repeat` (before `batch`) so the input provides samples for every step.";

    IdenticalShuffle = "W0504", Warning, "input workers shuffle identically",
"Several input workers (`input_workers` > 1) each shuffle their copy of the data. With a
fixed `shuffle(..., seed: n)` every worker produces the same order, so the model sees
each batch several times and others never.

    config { input_workers = 4 }   with   |> shuffle(1000, seed: 7)    // warning

Drop the seed: est derives a different seed for each worker from the run's
`random_seed` and the worker index, which is still deterministic.";

    ShardDivisibility = "E0505", Error, "global batch is not divisible by num_shards",
"With `num_shards = N`, the step is replicated over N shards and each reads
`params.batch_size / N` examples: inside `input` and `model`, `params.batch_size` is the
per-shard batch. The global batch must therefore be a multiple of N.

    params { batch_size: int = 100 }   config { num_shards = 3 }    // error

Choose a batch size divisible by the number of shards.";

    CheckpointSteps = "E0506", Error, "invalid save_checkpoint_steps",
"Checkpoints are written at loop boundaries, every `iterations_per_loop` steps, so
`save_checkpoint_steps` must be a multiple of `iterations_per_loop`. On the wafer, saving
is expensive compared to a step, and the interval has a lower bound of 100 steps.

    config { iterations_per_loop = 100  save_checkpoint_steps = 250 }   // error

Use a multiple of `iterations_per_loop` (and at least 100 on the wafer).";

    UnsupportedConfig = "E0507", Error, "unsupported config key",
"Some RunConfig keys of TensorFlow's Estimator are not supported by est:
`save_checkpoints_secs` (or `save_checkpoint_secs`), `keep_checkpoint_every_n_hours`,
`train_distribute`, `device_fn`, `protocol`, `eval_distribute`, `experimental_distribute`
and `experimental_max_worker_delay_secs`.

    config { save_checkpoint_secs = 600 }     // error

Use `save_checkpoint_steps` instead of seconds, and `num_shards` for distribution.";

    UnknownConfig = "E0508", Error, "unknown estimator field or config key",
"An estimator field or a `config` key is not one est knows. Estimator fields: `model`,
`train_input`, `eval_input`, `predict_input`, `model_dir`, `train_steps`, `eval_steps`,
`hooks`, `config`. Config keys: `iterations_per_loop`, `num_shards`,
`save_checkpoint_steps`, `save_summary_steps`, `keep_checkpoint_max`, `random_seed`,
`input_workers`, `log_step_count_steps`.

    config { iteration_per_loop = 100 }   // error: did you mean `iterations_per_loop`?

TensorFlow's names get est's: `max_steps` is the field `train_steps`, `steps` (an
EvalSpec's) `eval_steps`, `model_fn` `model`, `input_fn` `train_input`,
`save_checkpoints_steps` the key `save_checkpoint_steps`, `tf_random_seed` `random_seed`.

    max_steps = 1000   // error: TensorFlow's `max_steps` is est's `train_steps`

Correct the key.";

    WaferTrainingExtras = "E0509", Error, "hooks or metrics in a wafer training run",
"A training run on the wafer cannot run user hooks (the host does not see the step's
tensors between iterations) nor compute metrics (the train graph returns only the loss).
On the host both are allowed.

    train { minimize loss with sgd(lr: 0.1)  metric acc = accuracy(labels, argmax(logits, 1)) }
    // error with --target wafer

Move metrics to the `eval` section and drop hooks for wafer training, or train on host.";

    InvalidEstimator = "E0510", Error, "invalid estimator",
"An estimator lacks a required field (`model`, `train_input`), or a field has the wrong
kind of value: `model` must name a model, inputs must be calls of `input` items,
step counts must be positive integers.

    estimator e { train_input = digits(\"train\") }    // error: no `model`

Add the missing field or give it a value of the right kind.";

    InvalidModel = "E0511", Error, "invalid model",
"A model must say how it trains: a `train` section with one `minimize loss with
optimizer`, where the loss is a scalar floating-point tensor and the optimizer is a call
of one of `std.optim`'s optimizers. A metric must be made by a `std.metrics` function,
and a prediction must be a tensor whose first dimension is the batch.

    train { minimize logits with sgd(lr: 0.1) }    // error: the loss is f32[32, 10], not a scalar

Reduce the loss to a scalar (for example with a loss function from `std.losses`).";

    LabelsInPredict = "E0512", Error, "labels used in predict mode",
"In predict mode there are no labels: the input provides features only. A prediction
that depends on `labels` cannot be computed.

    predict { wrong = labels }     // error

Compute predictions from the features only.";

    UnmaskablePartialBatch = "W0513", Warning, "a partial last batch could not be evaluated exactly",
"An eval or predict input without `drop_remainder: true` may end with a batch smaller
than the graph's batch size. The runtime pads that batch with copies of its last row and
the compiler masks the padding: reductions over the batch (`reduce_mean`, `reduce_sum`,
... across the examples) count the real examples only, metrics see only the real rows,
and predict writes one row per real example.

That is exact for predictions and metric arguments with one row per example, and for a
loss that is a mean over the examples (an affine function of `reduce_mean`s over the
batch, as the `std.losses` functions and a regulariser added to them). This value is
neither: a loss that sums or takes a maximum over the batch, a metric fed one value per
batch (the smaller last batch would weigh as much as a full one), or a value that mixes
the examples through an op padding rows would change (a matmul that contracts the
batch, a softmax or a concat along it):

    eval { metric m = mean(reduce_mean(loss_per_example)) }  // one value per batch

It is a warning because an eval set that divides into full batches runs as it always
did; if a partial batch does arrive, the run stops with E0916. Compute the value per
example (`mean(loss_per_example)`), write the loss as a mean, or drop the partial batch
with `batch(n, drop_remainder: true)`.";
    SharedModelDir = "W0514", Warning, "estimators share a model_dir",
"Two estimators of the program name the same `model_dir`. Their training runs would
write checkpoints into one directory: the second would restore the first's (E0901 when
the models differ, silently when they fit) and their checkpoints would prune each
other's. Give each estimator its own `model_dir`.";
    UnsupportedOp = "E0601", Error, "operation not supported on the target",
"The chosen target cannot run this operation. The host runs every operation; the wafer
runs a declared list (matmul, convolution, elementwise, reductions, pooling, softmax,
embeddings, random numbers, slice, concat, pad, transpose, reshape, and their
gradients), and lays out chains of layers (a sum of products, one of them of the
layer before and the others of the inputs, is one layer) with residuals around one
dense layer (`h + f(h W)`) and layers of the inputs beside a later layer (a tower, a
shortcut): a value computed on the wafer that several layers read, or one read further
on than the sum just after the next layer, is E0601 too, as is a layer between two kernels
that run on one PE each (a `layer_norm` on both sides) when it does not fit one PE,
and a value a kernel reads that
mixes layers in anything but a scalar (a global norm and a shared weight's update
are computed by the host). The
label points at the expression that makes it, and the help names the nearest
formulation the target runs.

    let bucket = ids % 1_000     // error with --target wafer: `rem` is not supported

Express the computation with supported operations, or use the host target.";

    OutOfMemory = "E0602", Error, "the program does not fit in memory",
"`estc check` estimates what a run of each graph holds in memory: the variables (twice
for a train step, whose new values are computed before the old ones are replaced), the
peak of the intermediate values as the interpreter frees them (times the shards of a
step), and the input pipeline's buffers (per input worker: `shuffle` buffers, the batch
being assembled, `prefetch`, the hand-off queue; an in-memory `cache` is not counted). A
program beyond the limit would fail to allocate or wake the OOM killer after minutes of
work, so it is an error before anything runs. The message gives the estimate by kind and
the largest tensors.

    let x = dense(features, 1_000_000_000)   // error: a kernel of 256 GB

Make the largest tensors smaller (the batch size, a layer's width), or set the limit
with `--memory-limit SIZE` (default: this machine's memory, `MemTotal`).

At run time, under a process limit lower than the estimate knew of (`ulimit -v`, as
batch schedulers set), an allocation that fails ends `estc` with this code and status 1
(`out of memory: an allocation of 190.7 MiB failed; this process may use at most 1.1 GiB`),
never an abort; a variable, a batch or a kernel's result that cannot be allocated is
reported at its place in the program (E0906, E0905). The last checkpoint is whole.";
    WaferSram = "E0603", Error, "a wafer kernel does not fit a PE's memory",
"On the wafer every layer keeps its weights, their gradients, the optimiser's state and
the activations its backward pass needs in the SRAM of its own PEs (48 KiB each on the
named configs, of which 6 KiB hold code and runtime). `estc check --target wafer` lays
the program out on the fabric (`--wafer CONFIG`, default `test32`) and tries every
block size: larger blocks need fewer PEs but more memory per PE. When even the
smallest blocks whose kernels fit the fabric's PEs leave one PE more to hold than its
SRAM, this is the error. The message names the kernel and breaks its PE's memory down
(code and runtime, weights, gradients, optimiser state, stashed activations, buffers).

    let h = dense(x, 4096)        // error on test32: 4096x4096 weights over 1,024 PEs

Stashed activations shrink with a smaller batch per step; every share shrinks on a
larger fabric (`--wafer test64`, `wse2`) or with fewer hidden units.";
    WaferPes = "E0604", Error, "the program needs more PEs than the fabric has",
"The wafer lays a program's kernels out as a staircase from the fabric's north-west
corner, each layer's output edge facing the next kernel's input. Each kernel takes at
least one PE per group of its inputs and outputs; when even the smallest staircase is
wider or taller than the fabric, the program does not fit. The message says how many
columns, rows and PEs are missing and which kernel runs off first.

    // 40 layers on a 32x32 fabric: each takes at least a PE on the diagonal
    for i in 0..40 { x = dense(x, 8) }

Use a larger fabric (`--wafer test64`, `wse2`), or fewer layers.";
    WaferColours = "E0605", Error, "the program needs more colours than the fabric has",
"Streams between kernels travel on colours (virtual channels); two streams crossing one
router need two colours, and each dense layer's own chains take four. A fabric gives
programs `colours` less `reserved_colours` of them. When the streams that meet on some
router need more, the program does not fit. The message names the first stream that
found no free colour and how many colours the layout needs.

    # fabric.toml: colours = 6, reserved_colours = 1   (5 for programs)

Use a fabric with more colours, or feed fewer separate inputs into the same layers.";

    UnusedValue = "W0701", Warning, "unused value",
"A `let` binding, a parameter or an import is never used in any mode. Names starting
with `_` are exempt.

    let h = dense(x, 64)     // warning: `h` is never used

Remove it, use it, or prefix its name with `_`.";

    ShadowedItem = "W0702", Warning, "a local or parameter shadows an item",
"A `let`, a parameter of a function, input or model, a `for` variable or a closure's
parameter takes the name of a function, input, model, imported module or built-in
(`mode`, `params`, `f32`, ...) that is visible there, standard library functions
included, so that the name no longer means the item where the binding is in scope.
(Rebinding a local with `let` is normal and not warned about.)

    let relu = 3                    // warning: local `relu` shadows the function `relu`
    input digits(shuffle: bool) {}  // warning: parameter `shuffle` shadows the function

Rename the local or the parameter.";

    UnusedModel = "W0703", Warning, "model is not used by any estimator",
"Models are checked through the estimators that use them, because the input pipeline
determines their batch size. A model that no estimator names is not checked.

    model spare(features: f32[B, 4], labels: i32[B]) { ... }    // warning

Add an estimator that uses it, or remove it.";
    NoGradient = "E0801", Error, "no gradient on a path to the loss",
"Training needs the gradient of the loss with respect to every trainable variable.
Autodiff found an op between a variable and the loss that has no gradient: `argmax`,
`argmin`, a comparison, `floor`, `sign` or a cast to an integer type. The optimiser
would never see that path.

    let classes = cast(argmax(logits, 1), f32)
    let loss = reduce_mean(classes - cast(labels, f32))   // error: argmax has no gradient

Compute the loss from differentiable ops (e.g. `softmax_cross_entropy` on the logits).";
    CheckpointMismatch = "E0901", Error, "checkpoint does not fit the program",
"`model_dir` holds a checkpoint whose variables differ from the program's: a variable is
missing, extra, or has another shape or dtype. The message names each one. est refuses
to resume from it rather than train a model that silently started from scratch.

Use a fresh `--model-dir`, or restore the program the checkpoint was written by.";
    NonFiniteLoss = "E0902", Error, "NaN or infinity in training",
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
    HooksOnWafer = "E0903", Error, "user hooks on the wafer",
"On the wafer a loop of `iterations_per_loop` steps runs on the device without a round
trip to the host, so a hook cannot run between steps (the TPU Estimator refuses hooks
for the same reason). Register hooks with the interp or host targets, or use summaries
and checkpoints, which run at loop boundaries.";
    RunIo = "E0904", Error, "cannot read or write run files",
"A file the run needs could not be read or written: a data file of the input pipeline,
a checkpoint, a summary or a prediction output. The message names the file and the
operating system's reason. Nothing already saved is touched.";
    BadData = "E0905", Error, "bad input data",
"The input pipeline read a record it cannot use: a CSV row with the wrong number of
fields, a value that does not parse as the column's type, a byte string of the wrong
length for `decode_raw`. The message names the file and the record.";
    RunFailed = "E0906", Error, "an op failed at run time",
"An op met a value it cannot compute with: an index out of range in `gather`, an integer
division by zero. The message names the op and where it comes from in the program.";
    EndlessEval = "E0907", Error, "evaluation would never end",
"The eval input repeats forever and no number of eval steps is given, so evaluation
would never end. Give `eval_steps` in the estimator (or `--steps` on the command line),
or remove the `repeat` from the eval input.";
    NoRuntime = "E0908", Error, "target cannot run programs yet",
"`estc train`, `eval` and `predict` run on the reference interpreter (`--target interp`),
on the host (`--target host`, through LLVM) and on the simulated wafer (`--target
wafer`). An estc built without the `llvm` cargo feature cannot run the host target
(rebuild with `--features llvm`).";
    ModelDirLocked = "E0909", Error, "model_dir is in use by another training run",
"A training run holds an exclusive lock on its `model_dir` (`flock` on `.est.lock`, which
names the holder's PID), so that two runs never overwrite each other's checkpoints. The
kernel releases the lock when the run exits, however it exits, so the lock of a crashed
run is taken over by the next one. `estc eval` and `estc predict` take no lock and may
run alongside training.

Wait for the other run to finish, or train in another `--model-dir`.";
    DamagedCheckpoint = "W0910", Warning, "a damaged checkpoint was skipped",
"A checkpoint in `model_dir` is damaged: its metadata is not valid JSON, does not match
its own checksum or is inconsistent (a `global_step` other than the file's step, a
negative step, an `input_position` beyond what the steps could have read), its tensors
file is missing, or a tensor does not match its CRC32C checksum. The run goes on from
the newest intact checkpoint, and the message names both. A training run moves the
damaged files aside (`ckpt-N.json.damaged`, `ckpt-N.safetensors.damaged`), where no run
reads or prunes them; `eval` and `predict` leave them in place.";
    NoCheckpoint = "E0911", Error, "no usable checkpoint",
"`estc eval` and `estc predict` need a checkpoint: evaluating untrained weights would
print numbers that mean nothing. Or every checkpoint in `model_dir` is damaged (each
named with why), and training will not silently start over beside them.

Train first (`estc train`), point `--model-dir` at a training run's directory, or train
from scratch in a fresh `--model-dir`.";
    ForeignModelDir = "E0912", Error, "model_dir holds another framework's checkpoints",
"`model_dir` holds files of another framework's checkpoints: TensorFlow's (`checkpoint`,
`ckpt-N.index`, `ckpt-N.data-00000-of-00001`, `saved_model.pb`), Keras's (`.h5`,
`.keras`) or PyTorch's (`.pt`, `.pth`). est cannot read them, and would otherwise treat
the directory as empty and write its own checkpoints beside them. Use a fresh
`--model-dir`.";
    NoExamples = "E0913", Error, "evaluation or prediction over no examples",
"An evaluation (or prediction) ran over no batch: `--steps 0`, or an input whose files
are empty or whose filters drop every element. Its metrics
would be meaningless (an accuracy of 0 over nothing), so nothing is reported and
nothing is written: no summary, no prediction file.";
    SummariesNotWritten = "W0914", Warning, "summaries could not be written",
"The TensorBoard summaries of an evaluation could not be written in `model_dir/eval`
(a read-only directory, a full disk). The evaluation's metrics are reported all the
same; only TensorBoard will not see them.";
    LabelOutOfRange = "E0915", Error, "a class label is out of range",
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
    InexactPartialBatch = "E0916", Error, "a partial batch arrived that cannot be evaluated exactly",
"The eval or predict input ended with a partial batch, and the graph has outputs that a
padded batch would change (each was W0513 at check time: a loss that is not a mean over
the examples, a metric fed one value per batch, a value that mixes the examples). The
run stops rather than report a number that depends on the batch size. Write those
outputs per example (or the loss as a mean), or drop the partial batch with
`batch(n, drop_remainder: true)`.";
    HostCompile = "E0917", Error, "the host compiler failed",
"Compiling a graph for the host target (LLVM 19, `--target host`) failed: LLVM has no
code generator for this CPU, rejected the IR it was given, or could not link the
machine code into the process. The message says which. This is a problem of est or of
the machine, not of the program: run the program with `--target interp` meanwhile, and
report the message.";
    NativeLibrary = "E0918", Error, "the native library cannot be built",
"`estc build --lib` writes the predict graph as a shared library and a C header, which
run without est. Building one failed: the graph has an op that the library has no
standalone kernel for (the message names it: random numbers, or average pooling or a
convolution computed in f16 or bf16), a variable of a dtype its checkpoint loader
cannot read (f16 and bf16), an input of byte strings, or the C compiler that
links the library (`cc`, or the one `CC` names) is missing or failed (its output is in
the message). Serve such a model from est itself (`estc predict`) meanwhile.";
    UnknownCpu = "E0919", Error, "LLVM does not know the CPU `--cpu` names",
"`estc build --cpu NAME` generates code for a named CPU (`x86-64-v3`, `znver4`,
`skylake-avx512`) instead of this machine's. LLVM 19 does
not know the name given, and would otherwise have gone on silently with a generic
CPU. `llc-19 -mcpu=help` lists the names it knows (every x86-64 processor and the
levels `x86-64`, `x86-64-v2`, `x86-64-v3`, `x86-64-v4`); leave `--cpu` out for this
machine's own.";
    WaferArtifact = "E0920", Error, "a wafer artifact cannot be run",
"`estc sim FILE.estw` runs a program laid out for the wafer by `estc build --target
wafer -o FILE.estw`. The file could not be run: it cannot be read, it is not such an
artifact (another file, or one damaged: cut short, edited), it was written by another
version of the format, or it was compiled for another fabric than the one it is to
run on (the message names both: an artifact places every kernel for one fabric's
size, memory and colours). Rebuild it for the fabric you run it on:

    estc build model.est --target wafer --wafer wse2 -o model.estw
    estc sim model.estw --wafer wse2";
    WarmStart = "E0921", Error, "a warm start cannot be made",
"An estimator's `warm_start_from` starts a fresh run's variables from another run's
checkpoint (TensorFlow's `WarmStartSettings`), for fine-tuning from pre-trained weights.
It failed: the checkpoint cannot be found or read, or a variable to warm-start is not
in it (under its name, or the name `rename` maps it to), or it is there with another
shape or dtype. The message names the variable. Nothing is trained and nothing is
written to the model directory.

    warm_start_from = warm_start(\"../pretrained\", rename: [(\"classifier/kernel\", \"head/kernel\")])

Map the variable to its name in the checkpoint with `rename`, leave it to its
initialiser with `skip: [\"classifier\"]` (a new head), or restrict the warm start to
some variables with `vars: \"encoder\"`.";
    Export = "E0922", Error, "the model cannot be exported",
"`estc export --format onnx` writes the predict graph as an ONNX model whose batch size
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
    ExportVerify = "E0923", Error, "the exported model does not match est",
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
    RankFailed = "E0924", Error, "another rank of the run failed",
"In a run across ranks (`mpirun -n N estc train`), every rank takes part in each train
step, evaluation batch and restore. One rank failed (its input could not be read, an
op failed on its batch, rank 0 could not restore the model, or a rank was at another
point of the run), so the others stop at the same step instead of waiting for it. The
failing rank prints its own diagnostic, which says why; rank 0 saves the last complete
step as a checkpoint when it can, so running the same command again resumes from it.

A rank that dies outright (killed, out of memory) takes the job down through `mpirun`,
which names it; the ranks still running say that they were stopped.";
    RanksDisagree = "E0925", Error, "the ranks of a run do not run the same program",
"Every rank of a run across ranks must run the same estimator of the same program: the
same files and params, `--config` overrides, target and version of est, checked for the
same number of ranks, on the same data (the files of the train, eval and predict inputs:
their paths and sizes, and a checksum of the ends of the first files of each source). The ranks compare
all of this when they start, and refuse to run when they differ, since their gradients
would not be of one model and their evaluations not of one set. The message names the
rank and what differs.

Start every rank from one command line (`mpirun -n 4 estc train model.est`) with
identical copies of the files on every machine.";
}
