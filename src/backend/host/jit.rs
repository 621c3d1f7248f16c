//! From LLVM IR to callable machine code: a `TargetMachine` for the host CPU (or a
//! pinned one), the optimisation pipeline, object emission, and ORC LLJIT (through
//! llvm-sys: inkwell 0.11 has no ORC) to link the objects into this process.

use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::OptimizationLevel;
use llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcDisposeLLJIT, LLVMOrcLLJITAddObjectFile,
    LLVMOrcLLJITGetGlobalPrefix, LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITRef,
};
use llvm_sys::orc2::{
    LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, LLVMOrcDefinitionGeneratorRef,
    LLVMOrcJITDylibAddGenerator, LLVMOrcJITTargetAddress,
};
use std::ffi::{CStr, CString};
use std::sync::OnceLock;

/// The optimisation pipeline of every kernel module: what our kernels need of LLVM's
/// O2 and no more. SROA makes the accumulators registers; early CSE, instcombine and
/// simplifycfg fold the address arithmetic and branches the generator leaves; LICM
/// hoists what a loop does not change; the loop vectoriser vectorises the fused
/// loops (the convolutions are vectors already), and a last instcombine and
/// simplifycfg clean up after it. No unrolling: the kernels that gain from it (the
/// convolutions' register blocks, the pooling taps) are unrolled as generated.
///
/// Measured on this machine against `default<O2>` without unrolling, its predecessor
/// (mnist_cnn's train step, `EST_TIME_PASSES=1 estc build`): optimising took
/// 80-140 ms per part and now 25-35 ms, and with `CODEGEN_ARGS` emitting 70-100 ms
/// and now 55-70 ms; training speed stayed the same (fc_mnist 586-600 and 592 steps/s,
/// mnist_cnn 13.1-13.3 and 13.2, 1 thread, alternating runs). The O2 passes left out
/// (inlining, IndVarSimplify, loop unswitching, SLP, GVN, jump threading, ...) cost
/// time and bought nothing measurable on these kernels.
pub const PIPELINE: &str = "function(sroa,early-cse,simplifycfg,instcombine<no-verify-fixpoint>,loop-mssa(licm),loop-vectorize,instcombine<no-verify-fixpoint>,simplifycfg)";

/// Options of LLVM's code generator, given before `EST_LLVM_ARGS`. Loop strength
/// reduction took a quarter of code generation on mnist_cnn's kernels (`llc
/// -time-passes`) and changed no kernel's speed measurably (the convolutions address
/// their operands with constant offsets from a few pointers already).
const CODEGEN_ARGS: &[&str] = &["-disable-lsr"];

/// The code generator's optimisation level: `Less` (llc's -O1) rather than
/// `Aggressive` cut emitting mnist_cnn's train step by 12% (113 against 128-142 ms in
/// one part, `EST_TIME_PASSES=1 estc build`) at the same training speed (mnist_cnn
/// 13.6 steps/s either way, fc_mnist 589-620, alternating runs at 1 thread): what the
/// higher levels add (more scheduling and register allocation effort) buys nothing on
/// loops that the IR pipeline already shaped.
const CODEGEN_LEVEL: OptimizationLevel = OptimizationLevel::Less;

/// LLVM's options for this process: `CODEGEN_ARGS`, then `EST_LLVM_ARGS`'s, read once.
fn llvm_args() -> &'static [String] {
    static ARGS: OnceLock<Vec<String>> = OnceLock::new();
    ARGS.get_or_init(|| {
        let user = std::env::var("EST_LLVM_ARGS").unwrap_or_default();
        (CODEGEN_ARGS.iter().copied())
            .chain(user.split_whitespace())
            .map(String::from)
            .collect()
    })
}

/// Everything besides the module and the CPU that decides the code: the pipeline, the
/// code generator's level and LLVM's options (part of the cache's key).
pub fn recipe() -> String {
    [PIPELINE.to_string(), format!("-O{}", CODEGEN_LEVEL as u32)]
        .into_iter()
        .chain(llvm_args().iter().cloned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A code generator for one CPU.
pub struct Machine {
    tm: TargetMachine,
    pub triple: String,
    pub cpu: String,
    pub features: String,
}

/// Initialises LLVM's code generator for this machine, once; an error when this LLVM
/// has none for it. `EST_LLVM_ARGS` passes options to LLVM first, as `llc` takes them
/// (`-time-passes`, `-print-after=loop-vectorize`): for reading what it does.
fn init() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let args: Vec<CString> = std::iter::once("est")
            .chain(llvm_args().iter().map(String::as_str))
            .filter_map(|s| CString::new(s).ok())
            .collect();
        let ptrs: Vec<*const std::ffi::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: argv-style strings that outlive the call.
        unsafe {
            llvm_sys::support::LLVMParseCommandLineOptions(
                ptrs.len() as i32,
                ptrs.as_ptr(),
                std::ptr::null(),
            )
        };
        Target::initialize_native(&InitializationConfig::default())
    })
    .clone()
}

impl Machine {
    /// The CPU this process runs on, with all its features.
    pub fn host() -> Result<Machine, String> {
        init()?;
        let cpu = TargetMachine::get_host_cpu_name().to_string();
        let features = TargetMachine::get_host_cpu_features().to_string();
        Machine::with(&cpu, &features)
    }

    /// A named CPU (`x86-64-v3`, `znver3`) with its own features, for code that runs
    /// elsewhere or is inspected; `Ok(None)` when LLVM does not know the name.
    pub fn named(cpu: &str) -> Result<Option<Machine>, String> {
        init()?;
        let (m, said) = catch_stderr(|| Machine::with(cpu, ""))?;
        // LLVM's C API cannot ask whether it knows a CPU; making a target machine for
        // one it does not know says so on stderr and goes on with a generic CPU
        if said.contains("is not a recognized processor") {
            return Ok(None);
        }
        m.map(Some)
    }

    /// A code generator for a CPU with these features (one per compiling thread: a
    /// target machine is not shared between threads).
    pub fn with(cpu: &str, features: &str) -> Result<Machine, String> {
        let triple = TargetMachine::get_default_triple();
        let target = Target::from_triple(&triple).map_err(|e| e.to_string())?;
        let tm = target
            .create_target_machine(
                &triple,
                cpu,
                features,
                CODEGEN_LEVEL,
                RelocMode::PIC,
                CodeModel::Default,
            )
            .ok_or_else(|| format!("LLVM has no target machine for CPU `{cpu}`"))?;
        Ok(Machine {
            triple: triple.as_str().to_string_lossy().into_owned(),
            tm,
            cpu: cpu.to_string(),
            features: features.to_string(),
        })
    }

    /// Sets the module's triple and data layout, verifies it and optimises it.
    pub fn optimize(&self, module: &Module) -> Result<(), String> {
        module.set_triple(&TargetTriple::create(&self.triple));
        module.set_data_layout(&self.tm.get_target_data().get_data_layout());
        module.verify().map_err(|e| e.to_string())?;
        module
            .run_passes(PIPELINE, &self.tm, PassBuilderOptions::create())
            .map_err(|e| e.to_string())
    }

    pub fn emit(&self, module: &Module, kind: FileType) -> Result<Vec<u8>, String> {
        self.tm
            .write_to_memory_buffer(module, kind)
            .map(|b| b.as_slice().to_vec())
            .map_err(|e| e.to_string())
    }
}

/// Runs `f` with what it writes to stderr (file descriptor 2, where LLVM writes its
/// warnings) caught, and returns that text too. Only for short calls that write a
/// few lines: the text goes through a pipe read after `f` returns.
fn catch_stderr<T>(f: impl FnOnce() -> T) -> Result<(T, String), String> {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let mut fds = [0; 2];
    // SAFETY: plain file descriptor calls on descriptors this function owns, and fd 2
    // is put back before it returns.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err("cannot make a pipe to read LLVM's messages".into());
        }
        let saved = libc::dup(2);
        if saved < 0 || libc::dup2(fds[1], 2) < 0 {
            libc::close(fds[0]);
            libc::close(fds[1]);
            if saved >= 0 {
                libc::close(saved);
            }
            return Err("cannot redirect stderr to read LLVM's messages".into());
        }
        let out = f();
        libc::dup2(saved, 2);
        libc::close(saved);
        libc::close(fds[1]);
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            text.extend_from_slice(&buf[..n as usize]);
        }
        libc::close(fds[0]);
        Ok((out, String::from_utf8_lossy(&text).into_owned()))
    }
}

// SAFETY: a TargetMachine may move between threads; it is used by one at a time.
unsafe impl Send for Machine {}

/// Linked machine code: an LLJIT instance holding objects.
pub struct Jit {
    jit: LLVMOrcLLJITRef,
}

// SAFETY: the LLJIT is only used through &mut self (adding objects) or to look up
// addresses; the code it holds is immutable once linked.
unsafe impl Send for Jit {}
unsafe impl Sync for Jit {}

fn error(e: LLVMErrorRef) -> String {
    // SAFETY: e is a non-null error, consumed here.
    unsafe {
        let m = LLVMGetErrorMessage(e);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        s
    }
}

impl Jit {
    pub fn new() -> Result<Jit, String> {
        init()?;
        let mut jit: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: a null builder makes LLJIT detect the host; the process's symbols
        // (libm's powf, memcpy, memset) resolve what kernels call.
        unsafe {
            let err = LLVMOrcCreateLLJIT(&mut jit, std::ptr::null_mut());
            if !err.is_null() {
                return Err(error(err));
            }
            let mut gen: LLVMOrcDefinitionGeneratorRef = std::ptr::null_mut();
            let prefix = LLVMOrcLLJITGetGlobalPrefix(jit);
            let err = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                &mut gen,
                prefix,
                None,
                std::ptr::null_mut(),
            );
            if !err.is_null() {
                LLVMOrcDisposeLLJIT(jit);
                return Err(error(err));
            }
            LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
        }
        Ok(Jit { jit })
    }

    /// Links an object file.
    pub fn add_object(&mut self, object: &[u8]) -> Result<(), String> {
        let name = CString::new("est-kernels").expect("no NUL");
        // SAFETY: the buffer is copied by LLVM and owned by the JIT afterwards.
        unsafe {
            let buf = llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast(),
                object.len(),
                name.as_ptr(),
            );
            let err =
                LLVMOrcLLJITAddObjectFile(self.jit, LLVMOrcLLJITGetMainJITDylib(self.jit), buf);
            if !err.is_null() {
                return Err(error(err));
            }
        }
        Ok(())
    }

    /// The address of a linked function.
    pub fn lookup(&self, name: &str) -> Result<usize, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        let mut addr: LLVMOrcJITTargetAddress = 0;
        // SAFETY: looks up a symbol by name in this JIT.
        let err = unsafe { LLVMOrcLLJITLookup(self.jit, &mut addr, c.as_ptr()) };
        if !err.is_null() {
            return Err(error(err));
        }
        Ok(addr as usize)
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        // SAFETY: the JIT was created by LLVMOrcCreateLLJIT and is dropped once.
        unsafe {
            LLVMOrcDisposeLLJIT(self.jit);
        }
    }
}
