//! The catalogue of diagnostic codes: one row per code with its severity, a title and the
//! long explanation `estc explain CODE` prints (the texts in `explain_check.rs` and
//! `explain_run.rs`). `docs/diagnostics.md` is generated from this table (a test keeps
//! the two in step).

use super::explain_check as check;
use super::explain_run as run;
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
    ($( $variant:ident = $id:literal, $sev:ident, $title:literal, $expl:expr; )*) => {
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
    SyntaxError = "E0101", Error, "syntax error", check::E0101;
    UnexpectedEof = "E0102", Error, "unexpected end of file", check::E0102;
    InvalidCharacter = "E0103", Error, "invalid character", check::E0103;
    InvalidLiteral = "E0104", Error, "invalid literal", check::E0104;
    UnreadableModule = "E0105", Error, "imported file cannot be read", check::E0105;
    UnreadableFile = "E0106", Error, "a file read at compile time cannot be read", check::E0106;
    UnknownName = "E0201", Error, "unknown name", check::E0201;
    UnknownModule = "E0202", Error, "unknown module", check::E0202;
    UnknownItem = "E0203", Error, "unknown item in module", check::E0203;
    DuplicateDefinition = "E0204", Error, "duplicate definition", check::E0204;
    UnknownField = "E0205", Error, "unknown field", check::E0205;
    TensorLoopBound = "E0301", Error, "loop bound depends on a tensor", check::E0301;
    TensorCondition = "E0302", Error, "condition depends on a tensor", check::E0302;
    WrongArity = "E0303", Error, "wrong number of arguments", check::E0303;
    UnknownArgument = "E0304", Error, "unknown named argument", check::E0304;
    TypeMismatch = "E0305", Error, "wrong kind of value", check::E0305;
    InvalidParamOverride = "E0306", Error, "invalid params override", check::E0306;
    RecursionLimit = "E0307", Error, "recursion too deep", check::E0307;
    StaticEvalError = "E0308", Error, "static evaluation failed", check::E0308;
    AssignUndefined = "E0309", Error, "assignment to an undefined name", check::E0309;
    MisplacedStatement = "E0310", Error, "statement in the wrong place", check::E0310;
    ShapeMismatch = "E0401", Error, "shape mismatch", check::E0401;
    DtypeMismatch = "E0402", Error, "dtype mismatch", check::E0402;
    Int64 = "E0403", Error, "64-bit integers are not supported", check::E0403;
    InvalidShape = "E0404", Error, "invalid shape", check::E0404;
    InvalidAxis = "E0405", Error, "invalid axis", check::E0405;
    UnboundDimension = "E0406", Error, "dimension cannot be determined", check::E0406;
    InputModelMismatch = "E0407", Error, "input does not match the model", check::E0407;
    BytesInModel = "E0408", Error, "bytes in a model", check::E0408;
    InputNotDataset = "E0501", Error, "input does not produce the model's (features, labels)", check::E0501;
    BatchNotFixed = "E0502", Error, "batch size is not fixed", check::E0502;
    NoRepeat = "E0503", Error, "training input would run out", check::E0503;
    IdenticalShuffle = "W0504", Warning, "input workers shuffle identically", check::W0504;
    ShardDivisibility = "E0505", Error, "global batch is not divisible by num_shards", check::E0505;
    CheckpointSteps = "E0506", Error, "invalid save_checkpoint_steps", check::E0506;
    UnsupportedConfig = "E0507", Error, "unsupported config key", check::E0507;
    UnknownConfig = "E0508", Error, "unknown estimator field or config key", check::E0508;
    WaferTrainingExtras = "E0509", Error, "hooks or metrics in a wafer training run", check::E0509;
    InvalidEstimator = "E0510", Error, "invalid estimator", check::E0510;
    InvalidModel = "E0511", Error, "invalid model", check::E0511;
    LabelsInPredict = "E0512", Error, "labels used in predict mode", check::E0512;
    UnmaskablePartialBatch = "W0513", Warning, "a partial last batch could not be evaluated exactly", check::W0513;
    SharedModelDir = "W0514", Warning, "estimators share a model_dir", check::W0514;
    UnsupportedOp = "E0601", Error, "operation not supported on the target", check::E0601;
    OutOfMemory = "E0602", Error, "the program does not fit in memory", check::E0602;
    WaferSram = "E0603", Error, "a wafer kernel does not fit a PE's memory", check::E0603;
    WaferPes = "E0604", Error, "the program needs more PEs than the fabric has", check::E0604;
    WaferColours = "E0605", Error, "the program needs more colours than the fabric has", check::E0605;
    UnusedValue = "W0701", Warning, "unused value", check::W0701;
    ShadowedItem = "W0702", Warning, "a local or parameter shadows an item", check::W0702;
    UnusedModel = "W0703", Warning, "model is not used by any estimator", check::W0703;
    NoGradient = "E0801", Error, "no gradient on a path to the loss", check::E0801;
    CheckpointMismatch = "E0901", Error, "checkpoint does not fit the program", run::E0901;
    NonFiniteLoss = "E0902", Error, "NaN or infinity in training", run::E0902;
    HooksOnWafer = "E0903", Error, "user hooks on the wafer", run::E0903;
    RunIo = "E0904", Error, "cannot read or write run files", run::E0904;
    BadData = "E0905", Error, "bad input data", run::E0905;
    RunFailed = "E0906", Error, "an op failed at run time", run::E0906;
    EndlessEval = "E0907", Error, "evaluation would never end", run::E0907;
    NoRuntime = "E0908", Error, "target cannot run programs yet", run::E0908;
    ModelDirLocked = "E0909", Error, "model_dir is in use by another training run", run::E0909;
    DamagedCheckpoint = "W0910", Warning, "a damaged checkpoint was skipped", run::W0910;
    NoCheckpoint = "E0911", Error, "no usable checkpoint", run::E0911;
    ForeignModelDir = "E0912", Error, "model_dir holds another framework's checkpoints", run::E0912;
    NoExamples = "E0913", Error, "evaluation or prediction over no examples", run::E0913;
    SummariesNotWritten = "W0914", Warning, "summaries could not be written", run::W0914;
    LabelOutOfRange = "E0915", Error, "a class label is out of range", run::E0915;
    InexactPartialBatch = "E0916", Error, "a partial batch arrived that cannot be evaluated exactly", run::E0916;
    HostCompile = "E0917", Error, "the host compiler failed", run::E0917;
    NativeLibrary = "E0918", Error, "the native library cannot be built", run::E0918;
    UnknownCpu = "E0919", Error, "LLVM does not know the CPU `--cpu` names", run::E0919;
    WaferArtifact = "E0920", Error, "a wafer artifact cannot be run", run::E0920;
    WarmStart = "E0921", Error, "a warm start cannot be made", run::E0921;
    Export = "E0922", Error, "the model cannot be exported", run::E0922;
    ExportVerify = "E0923", Error, "the exported model does not match est", run::E0923;
    RankFailed = "E0924", Error, "another rank of the run failed", run::E0924;
    RanksDisagree = "E0925", Error, "the ranks of a run do not run the same program", run::E0925;
}
