//! The long explanations (`estc explain CODE`) of the codes `estc check` reports: syntax,
//! names, static evaluation, shapes and dtypes, the Estimator's rules, fit and target
//! support, lints, gradients. The table in `codes.rs` ties each to its code.

pub const E0101: &str =
    "The parser met a token it did not expect. The message says what it found and what
could have come instead. The parser recovers at the next statement or item, so every
syntax error of a file is reported in one run.

    model m(features: f32[B, 4], labels: i32[B]) {
      let x = dense(features 10)     // error: expected `,` or `)`
    }

Fix the text at the label; the help lists the tokens that would fit.";

pub const E0102: &str =
    "The file ended while a construct was still open, most often a `{`, `(` or `[` without
its closing partner.

    fn block(x) {
      dense(x, 10)
    // error: the file ends before the `}` of `block`

Close the construct that the label points at.";

pub const E0103: &str =
    "The lexer found text that is no token of est: a stray character such as `$` or `#`, a
string without its closing quote on the same line, or a block comment `/*` without its
`*/`.

    let x = 3 # comment      // error: `#` starts no token; comments start with `//`

Remove the character, close the string, or write the comment with `//`.";

pub const E0104: &str =
    "A number does not fit its type (integers are 64-bit; floats must be finite), or a
string contains an unknown escape. Known escapes are `\\n`, `\\t`, `\\\\`, `\\\"` and
`\\{` (a literal brace in an interpolated string).

    let n = 99999999999999999999   // error: too large for a 64-bit integer

Write a smaller number or a valid escape.";

pub const E0105: &str =
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

pub const E0106: &str =
    "A file the program reads while it is compiled, such as the vocabulary file of
`lookup`, does not exist, cannot be read, or is not UTF-8 text. Paths are relative to
the directory of the program's root file.

    let ids = lookup(row.workclass, \"vocab/workclas.txt\")   // error: cannot read
                                                              // vocab/workclas.txt

Fix the path, or give the vocabulary as a list of strings.";

pub const E0201: &str =
    "A name is used that no `let`, parameter, item, import or the prelude defines. The
help suggests a close name when there is one.

    use std.nn.dense
    model m(features: f32[B, 4], labels: i32[B]) {
      let logits = dense(featurs, 3)   // error: unknown name `featurs`
    }

Correct the spelling, import the item with `use`, or define the name first.";

pub const E0202: &str =
    "A `use` names a module that does not exist. `std.*` modules come with est (`std.nn`,
`std.losses`, `std.metrics`, `std.optim`, `std.data`, `std.hooks`, `std.prim`); other
paths name files relative to the importing file (`use lib.layers` reads
`lib/layers.est`).

    use std.layers.dense    // error: no module `std.layers`

Use an existing module, or create the file.";

pub const E0203: &str =
    "A `use` or a qualified name (`nn.dense`) names something the module does not define.

    use std.nn.{dense, conv3d}   // error: `std.nn` has no item `conv3d`

Check the module's items (the help lists close names) or import from the right module.";

pub const E0204: &str =
    "Two items of a module, two parameters of a function, two fields of a record, of a
`params` block or of an estimator, or two variables of one function call have the same
name; or a program has two `params` blocks. Each must be unique. (Two sections of one
kind in a model are E0310.)

    fn block(x) { x }
    fn block(x) { x }      // error: `block` is defined twice

Rename or remove one of them.";

pub const E0205: &str =
    "A field is read that the value does not have: a `params` field that is not declared,
a record field that is not there, or a property a tensor does not have (tensors have
`shape`, `dtype` and `rank`).

    params { batch_size: int = 32 }
    ... batch(params.batchsize)    // error: `params` has no field `batchsize`

Declare the field or correct its name.";

pub const E0301: &str =
    "`for` loops are unrolled when the program is compiled, so what they iterate over must
be static: a list, a range of static integers, or a params field. A tensor's value is
only known when the model runs.

    for i in 0..argmax(logits, 1) { ... }   // error: the bound is a tensor

Iterate over a static value. To choose between tensors elementwise, use
`where(cond, a, b)`; to repeat a layer, loop over a static count such as a params field.";

pub const E0302: &str =
    "`if` is resolved when the program is compiled, so its condition must be static: it
may depend on `mode`, `target`, params and other static values, but not on a tensor.

    if reduce_mean(x) > 0.0 { x = relu(x) }    // error: the condition is a tensor

Use `where(cond, a, b)` to choose elementwise between two tensors of the same shape.";

pub const E0303: &str =
    "A function is called with too many positional arguments, or without a required one.
The help shows the function's signature.

    fn block(x, units: int) { dense(x, units) }
    ... block(x)          // error: missing argument `units`

A pipeline's `map` passes each element to its closure as one value: a `(features,
labels)` pair is one tuple, which a tuple pattern takes apart.

    ds |> map |x, y| (x / 255.0, y)       // error: the closure takes 2 arguments
    ds |> map |(x, y)| (x / 255.0, y)     // ok

Pass every parameter that has no default, and no more than the function takes.";

pub const E0304: &str = "A named argument does not match any parameter of the called function, or names a
parameter that was already given positionally.

    conv2d(x, filter: 32, kernel: [5, 5])   // error: no parameter `filter` (did you mean `filters`?)

Use the parameter names of the function's signature.";

pub const E0305: &str =
    "A static value of the wrong kind is used: a string where an integer is expected, a
tensor where a static value is needed (such as a shape or a layer width), or a value
that is not callable is called.

    dense(x, units: \"ten\")    // error: expected an integer, found a string

Pass a value of the expected kind; the label says which one.";

pub const E0306: &str =
    "A `--param key=value` or a `--params FILE.yaml` entry names a field that the `params`
block does not declare, or gives a value that does not parse as the field's type.

    estc check model.est --param learning_rat=0.1   // error: no params field `learning_rat`

Override declared fields only, with values of their declared type (`int`, `float`,
`bool`, `string`, or a list such as `[128, 64]`).";

pub const E0307: &str =
    "Functions are inlined when the program is compiled; a function that calls itself
without a static base case never finishes inlining. est stops at 256 nested calls.

    fn f(x) { f(x) }     // error: recursion too deep

Give the recursion a static base case (`if n == 0 { ... }`) or use a `for` loop.";

pub const E0308: &str =
    "A static computation failed while the program was being compiled: a division by zero,
an index out of range, an integer overflow, a range that runs backwards (`3..1`), a
count that must be positive (`shuffle(0)`), a value a library function refuses (for
example a dropout rate outside [0, 1), reported by `static_assert`), or an elaboration
that unrolls too far (more than 20 million steps: graphs of several million nodes).

    let widths = [256, 128]
    let w = widths[2]        // error: index 2 is out of range for a list of 2

Fix the static values involved; the label shows the computation.";

pub const E0309: &str =
    "`name = value` updates a variable that an enclosing `let` introduced. Assigning a
name that does not exist yet is an error (it is usually a missing `let` or a typo).

    for u in [64, 64] { y = dense(x, u) }   // error: `y` is not defined

Introduce the variable with `let` first, or fix the name.";

pub const E0310: &str =
    "Some statements belong to one place only: `train`, `eval` and `predict` sections to
the top level of a model body; `minimize` to a train section; `metric` to train and
eval sections; a section appears at most once per model.

    fn block(x) { train { minimize x with sgd(lr: 0.1) } }   // error: a section outside a model

Move the statement where it belongs.";

pub const E0401: &str =
    "The shapes of the operands do not fit the operation: elementwise operations need
shapes that broadcast (equal, or 1, aligned from the right), `matmul` needs the inner
dimensions to agree, and so on. Both operands are labelled with their types.

    let y = x + bias     // error: f32[32, 10] and f32[5] do not broadcast

Reshape, transpose or slice one operand, or fix the layer sizes.";

pub const E0402: &str =
    "The operands have different dtypes, or the operation does not accept this dtype.
est never converts dtypes implicitly; static numbers adopt the dtype of the tensor
they meet.

    let y = cast(labels, f32) + labels     // error: f32 and i32

Convert one side with `cast(x, dtype)`.";

pub const E0403: &str =
    "`i64` tensors are not supported: neither the wafer nor the host backend keeps 64-bit
integers, except for the global step counter. Integer features read from records are
narrowed to i32 at `parse`, with a range check.

    model m(features: f32[B, 4], labels: i64[B])    // error: i64

Use `i32`, or `cast(x, i32)`.";

pub const E0404: &str =
    "A shape argument is not valid: a `reshape` that changes the number of elements, a
negative or zero dimension, more than one `-1`, or a shape that is not a list of
integers.

    reshape(x, [B, 27, 28, 1])     // error: 784 elements cannot become 756

Make the element counts agree.";

pub const E0405: &str =
    "An axis argument is out of range for the tensor's rank (axes count from 0, negative
axes from the end), or is given twice.

    argmax(logits, 2)     // error: axis 2 of a rank-2 tensor

Use an axis in `-rank..rank`.";

pub const E0406: &str = "A named dimension in a model's signature (such as `B` in `f32[B, 784]`) is bound by
the input pipeline's element shapes. When the pipeline does not determine it (for
example after `decode_raw` without a length), the model's signature must give it.

    input raw() { text(\"x.txt\") |> map |l| (decode_raw(l, u8), 0) |> batch(8, drop_remainder: true) }
    model m(features: f32[B, N], ...)     // error: N is not determined

Write the dimension as a number in the signature, or give the length to the pipeline.";

pub const E0407: &str =
    "The input pipeline's (features, labels) do not have the dtypes and shapes the model's
parameters declare. Both the model parameter and the pipeline are labelled.

    input d() { ... |> batch(32, drop_remainder: true) }   // yields f32[32, 64]
    model m(features: f32[B, 784], labels: i32[B])        // error: 64 vs 784

Change the model's signature or the pipeline so that they agree.";

pub const E0408: &str =
    "A model computes with numbers; byte strings are for input pipelines, where `parse`
reads them from records and `decode_raw` turns them into numbers inside a `map`. A
`bytes` tensor in a model graph (from `cast(x, bytes)`, say) has no meaning for any op
or backend.

    predict { raw = cast(logits, bytes) }   // error: bytes in a model

Decode byte strings in the input's `map` and give the model numeric tensors.";

pub const E0501: &str = "An estimator's input must be a dataset. As in TensorFlow, an element that is a pair is
`(features, labels)`, and any other element (a tensor or a record) is the features alone;
features and labels may each be a tensor, a record of tensors or a tuple of them, as the
model's signature declares. Labels are needed only by a model that takes them, and
never in predict mode. A tuple of three or more is neither.

    input d() { range(100) |> map |i| (i, i, i) |> batch(10) }   // error: a tuple of 3
    model m(features: f32[B, 4], labels: i32[B])                   // error if the input yields features only

Make the element a pair with a `map` (`|> map |(a, b, y)| ({ a: a, b: b }, y)`), or drop
the model's labels parameter if it learns from the features alone.";

pub const E0502: &str =
    "Every step must see the same batch size, because every tensor has a static shape. A
`batch` without `drop_remainder: true` makes the last batch of an epoch smaller. The
wafer target requires a fixed batch for every input; the host target requires it for the
train input.

    |> batch(params.batch_size)     // error: no drop_remainder

Write `batch(n, drop_remainder: true)`.";

pub const E0503: &str =
    "Training runs for a number of steps, not epochs. A train input without `repeat` ends
after one pass over its data, before the steps are done. The wafer needs samples for
every step, so this is an error there; on the host training simply stops when the input
ends, and nothing is reported.

    input d() { csv(\"x.csv\") |> batch(32, drop_remainder: true) }   // no repeat

Add `|> repeat` (before `batch`) so the input provides samples for every step.";

pub const W0504: &str =
    "Several input workers (`input_workers` > 1) each shuffle their copy of the data. With a
fixed `shuffle(..., seed: n)` every worker produces the same order, so the model sees
each batch several times and others never.

    config { input_workers = 4 }   with   |> shuffle(1000, seed: 7)    // warning

Drop the seed: est derives a different seed for each worker from the run's
`random_seed` and the worker index, which is still deterministic.";

pub const E0505: &str = "With `num_shards = N`, the step is replicated over N shards and each reads
`params.batch_size / N` examples: inside `input` and `model`, `params.batch_size` is the
per-shard batch. The global batch must therefore be a multiple of N.

    params { batch_size: int = 100 }   config { num_shards = 3 }    // error

Choose a batch size divisible by the number of shards.";

pub const E0506: &str =
    "Checkpoints are written at loop boundaries, every `iterations_per_loop` steps, so
`save_checkpoint_steps` must be a multiple of `iterations_per_loop`. On the wafer, saving
is expensive compared to a step, and the interval has a lower bound of 100 steps.

    config { iterations_per_loop = 100  save_checkpoint_steps = 250 }   // error

Use a multiple of `iterations_per_loop` (and at least 100 on the wafer).";

pub const E0507: &str = "Some RunConfig keys of TensorFlow's Estimator are not supported by est:
`save_checkpoints_secs` (or `save_checkpoint_secs`), `keep_checkpoint_every_n_hours`,
`train_distribute`, `device_fn`, `protocol`, `eval_distribute`, `experimental_distribute`
and `experimental_max_worker_delay_secs`.

    config { save_checkpoint_secs = 600 }     // error

Use `save_checkpoint_steps` instead of seconds, and `num_shards` for distribution.";

pub const E0508: &str =
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

pub const E0509: &str =
    "A training run on the wafer cannot run user hooks (the host does not see the step's
tensors between iterations) nor compute metrics (the train graph returns only the loss).
On the host both are allowed.

    train { minimize loss with sgd(lr: 0.1)  metric acc = accuracy(labels, argmax(logits, 1)) }
    // error with --target wafer

Move metrics to the `eval` section and drop hooks for wafer training, or train on host.";

pub const E0510: &str =
    "An estimator lacks a required field (`model`, `train_input`), or a field has the wrong
kind of value: `model` must name a model, inputs must be calls of `input` items,
step counts must be positive integers.

    estimator e { train_input = digits(\"train\") }    // error: no `model`

Add the missing field or give it a value of the right kind.";

pub const E0511: &str =
    "A model must say how it trains: a `train` section with one `minimize loss with
optimizer`, where the loss is a scalar floating-point tensor and the optimizer is a call
of one of `std.optim`'s optimizers. A metric must be made by a `std.metrics` function,
and a prediction must be a tensor whose first dimension is the batch.

    train { minimize logits with sgd(lr: 0.1) }    // error: the loss is f32[32, 10], not a scalar

Reduce the loss to a scalar (for example with a loss function from `std.losses`).";

pub const E0512: &str =
    "In predict mode there are no labels: the input provides features only. A prediction
that depends on `labels` cannot be computed.

    predict { wrong = labels }     // error

Compute predictions from the features only.";

pub const W0513: &str =
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

pub const W0514: &str =
    "Two estimators of the program name the same `model_dir`. Their training runs would
write checkpoints into one directory: the second would restore the first's (E0901 when
the models differ, silently when they fit) and their checkpoints would prune each
other's. Give each estimator its own `model_dir`.";

pub const E0601: &str =
    "The chosen target cannot run this operation. The host runs every operation; the wafer
runs a declared list (matmul, convolution, elementwise, reductions, pooling, softmax,
embeddings, random numbers, slice, concat, pad, transpose, reshape, and their
gradients), and lays out chains of layers (a sum of products, one of them of the
layer before and the others of the inputs, is one layer) with residuals around dense
layers and convolutions (`h + f(h W)`, `h + g(f(h V) W)`, a pre-LayerNorm block's
`h + f(layer_norm(h) W)`), two layers of one value (a tower, a projection shortcut),
dense layers of one value each of its own variable (fused into one layer of their
weights side by side: three towers, attention's separate query, key and value) and
layers of the inputs beside a later layer: a value computed on the wafer that three
or more kernels read otherwise (a tower of several layers beside another), or one
read further on than such a residual's sum, is E0601 too (a sequence the wafer makes,
such as an embedding's, read step by step by an unrolled recurrent layer is one: its
steps take their inputs from the host), as is a layer between two kernels
that run on one PE each (a `layer_norm` on both sides) when it does not fit one PE,
and a value a kernel reads that
mixes layers in anything but a scalar (a global norm and a shared weight's update
are computed by the host). The
label points at the expression that makes it, and the help names the nearest
formulation the target runs. On the wafer the check reports every construct a node
alone shows has no layout (an op over the batch, random numbers without it) at
once, each once, and then the first way its kernels do not meet.

    let bucket = ids % 1_000     // error with --target wafer: `rem` is not supported

Express the computation with supported operations, or use the host target.";

pub const E0602: &str =
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

pub const E0603: &str =
    "On the wafer every layer keeps its weights, their gradients, the optimiser's state and
the activations its backward pass needs in the SRAM of its own PEs (48 KiB each on the
named configs, of which 6 KiB hold code and runtime). `estc check --target wafer` lays
the program out on the fabric (`--wafer CONFIG`, default `test32`) and tries every
block size: larger blocks need fewer PEs but more memory per PE. When even the
smallest blocks whose kernels fit the fabric's PEs leave one PE more to hold than its
SRAM, this is the error. The message names the kernel and breaks its PE's memory down
(code and runtime, weights, gradients, optimiser state, stashed activations, buffers).

    let h = dense(x, 4096)        // error on test32: 4096x4096 weights over 1,024 PEs

The help names what would fit: the block size at which this kernel's PEs would hold it
(weights, gradients and optimiser state shrink with the square of the block, stashed
activations and buffers with the block), the PEs it would then take, and the smallest
named fabric with room for them. Stashed activations also shrink with a smaller batch
per step (the compiler already narrows the samples in flight first); every share
shrinks with fewer hidden units. A kernel that keeps every sample of the step (batch
norm in training, and the kernels before it, which must hold the batch until its
statistics are whole) is short of memory whatever the fabric where its PEs hold whole
channels (between convolutions they may hold a channel's band of rows instead, and
then a larger fabric has room for more bands): its help names the largest batch per
step the best of its sizings tried has room for (a smaller batch may let another
sizing fit more). A vector kernel that
holds each sample whole on one PE (a softmax over a sample's axes, attention's
products), or each head of a sample (attention with a head a PE, whose scores grow as
tokens x tokens), is short whatever the fabric too: its help asks for fewer tokens,
heads or features a sample.";

pub const E0604: &str =
    "The wafer lays a program's kernels out as a staircase from the fabric's north-west
corner, each layer's output edge facing the next kernel's input. Each kernel takes at
least one PE per group of its inputs and outputs; when even the smallest staircase is
wider or taller than the fabric, the program does not fit. The message says how many
columns, rows and PEs are missing and which kernel runs off first.

    // 40 layers on a 32x32 fabric: each takes at least a PE on the diagonal
    for i in 0..40 { x = dense(x, 8) }

The help names the rectangle the nearest layout spans and the smallest named fabric that
holds it (`--wafer test64`, `wse2`), or, when none does, that rectangle as a `.toml`
config's size; or use fewer layers.";

pub const E0605: &str =
    "Streams between kernels travel on colours (virtual channels); two streams crossing one
router need two colours, and each dense layer's own chains take four. A fabric gives
programs `colours` less `reserved_colours` of them. When the streams that meet on some
router need more, the program does not fit. The message names the first stream that
found no free colour and how many colours the layout needs.

    # fabric.toml: colours = 6, reserved_colours = 1   (5 for programs)

Use a fabric with more colours, or feed fewer separate inputs into the same layers.";

pub const W0701: &str =
    "A `let` binding, a parameter or an import is never used in any mode. Names starting
with `_` are exempt.

    let h = dense(x, 64)     // warning: `h` is never used

Remove it, use it, or prefix its name with `_`.";

pub const W0702: &str =
    "A `let`, a parameter of a function, input or model, a `for` variable or a closure's
parameter takes the name of a function, input, model, imported module or built-in
(`mode`, `params`, `f32`, ...) that is visible there, standard library functions
included, so that the name no longer means the item where the binding is in scope.
(Rebinding a local with `let` is normal and not warned about.)

    let relu = 3                    // warning: local `relu` shadows the function `relu`
    input digits(shuffle: bool) {}  // warning: parameter `shuffle` shadows the function

Rename the local or the parameter.";

pub const W0703: &str =
    "Models are checked through the estimators that use them, because the input pipeline
determines their batch size. A model that no estimator names is not checked.

    model spare(features: f32[B, 4], labels: i32[B]) { ... }    // warning

Add an estimator that uses it, or remove it.";

pub const E0801: &str =
    "Training needs the gradient of the loss with respect to every trainable variable.
Autodiff found an op between a variable and the loss that has no gradient: `argmax`,
`argmin`, a comparison, `floor`, `sign` or a cast to an integer type. The optimiser
would never see that path.

    let classes = cast(argmax(logits, 1), f32)
    let loss = reduce_mean(classes - cast(labels, f32))   // error: argmax has no gradient

Compute the loss from differentiable ops (e.g. `softmax_cross_entropy` on the logits).";
