//! `estc build --lib`: the predict graph as a shared library and a C header, for
//! serving a model without est.
//!
//! The kernels are generated as for a device, except for the ones a device runs
//! natively: GEMMs and float arg-reductions become generated loops too
//! (`Codegen::portable`), so that the object calls nothing outside itself, and the
//! others (index work, integer ops, average pooling, fallback convolutions) become C
//! functions of the generated C file (`c_kernels`). That file holds the rest too: the
//! memory plan as a table of offsets into one block, each kernel's table of buffer
//! addresses, a loader reading the variables of a checkpoint (`ckpt-N.safetensors`) by
//! name, dtype, shape and size, and the driver running the kernels in order on one
//! batch. `cc` (or `CC`) links the two into `lib<NAME>.so`.

use super::codegen::{Codegen, KernelFn};
use super::lower::{Elem, Kernel, Role, View};
use super::{host_machine, llvm_failed, lower_phases};
use crate::diag::{Code, Diag};
use crate::ir::{DType, Graph};
use crate::span::Span;
use inkwell::context::Context;
use inkwell::targets::FileType;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

mod c_kernels;

/// What `library` wrote.
#[derive(Debug, Clone)]
pub struct Library {
    /// The shared library, its header, its C source and its kernels' object.
    pub files: Vec<PathBuf>,
    pub kernels: usize,
    /// Bytes of the block a loaded model holds (arena and variables).
    pub bytes: usize,
}

/// One kernel of the library: its function, the extent of its outer loop, and its C
/// source when it is C of the library's source file (else it is generated code of the
/// library's object).
struct LibKernel {
    f: KernelFn,
    outer: usize,
    c: Option<String>,
}

/// A value crossing the library's interface: its C name, C type and where it lies.
struct Port {
    name: String,
    c_type: &'static str,
    view: View,
}

/// Writes `lib<name>.so`, `<name>.h`, `<name>.c` and `<name>_kernels.o` into `dir` for
/// the predict graph `graph` (of estimator `name`, at `at`).
pub fn library(
    graph: &Graph,
    at: Span,
    cpu: Option<&str>,
    name: &str,
    dir: &Path,
) -> Result<Library, Diag> {
    let fail = |span: Span, m: String| {
        Diag::new(Code::NativeLibrary, span, m)
            .label("in this predict graph")
            .help("serve this model with `estc predict` meanwhile")
    };
    let id = c_ident(name);
    let outputs = graph.outputs_with(crate::ir::Role::Prediction);
    if outputs.is_empty() {
        return Err(fail(at, "the estimator's model has no predictions".into()));
    }
    let phases = vec![outputs.iter().map(|o| o.1).collect::<Vec<_>>()];
    let lowered = lower_phases(graph, &phases, &[], 0)?;
    let machine = host_machine(at, cpu)?;
    let ctx = Context::create();
    let mut cg = Codegen::new(&ctx, &id, &machine.cpu, &machine.features);
    let mut kernels = Vec::new();
    for (i, k) in lowered.phases[0].iter().enumerate() {
        let name = format!("est_{id}_k{i}");
        let f = cg
            .portable(&name, k, graph, &lowered.bufs)
            .map_err(|m| llvm_failed(at, m))?;
        let node = graph.node(k.node());
        let f = match (f, k) {
            (Some(f), _) => LibKernel {
                f: f.0,
                outer: f.1,
                c: None,
            },
            (None, Kernel::Native { args, out, .. }) => {
                let (code, f) =
                    c_kernels::c_kernel(&name, &node.op, node.ty.dtype, args, out, &lowered.bufs)
                        .map_err(|m| fail(node.span, m))?;
                LibKernel {
                    f,
                    outer: 1,
                    c: Some(code),
                }
            }
            (None, _) => {
                return Err(fail(
                    node.span,
                    format!(
                        "`{}` has no kernel in a standalone library yet",
                        node.op.name()
                    ),
                ))
            }
        };
        kernels.push(f);
    }
    machine
        .optimize(&cg.module)
        .map_err(|m| llvm_failed(at, m))?;
    let object = machine
        .emit(&cg.module, FileType::Object)
        .map_err(|m| llvm_failed(at, m))?;

    // one block: the arena, then every variable (64-byte aligned)
    let bufs = &lowered.bufs.bufs;
    let mut offsets = Vec::with_capacity(bufs.len());
    let mut end = lowered.plan.arena;
    let mut vars = Vec::new();
    let mut inputs = Vec::new();
    for (b, (buf, off)) in bufs.iter().zip(&lowered.plan.offsets).enumerate() {
        let at_ = match (&buf.role, off) {
            (Role::Var(v), _) => {
                let o = end.next_multiple_of(64);
                end = o + buf.len * buf.elem.size();
                let dtype = graph.variable(v).map(|n| graph.node(n).ty.dtype);
                let st = match dtype {
                    Some(DType::F32) => "F32",
                    Some(DType::I32) => "I32",
                    Some(DType::I64) => "I64",
                    Some(DType::U8) => "U8",
                    Some(DType::Bool) => "BOOL",
                    d => {
                        return Err(fail(
                            at,
                            format!(
                                "variable `{v}` is {}, which the library's loader cannot read",
                                d.map_or("unknown".into(), |d| d.to_string())
                            ),
                        ))
                    }
                };
                let shape = graph
                    .variable(v)
                    .map_or(vec![buf.len], |n| graph.node(n).ty.shape.to_vec());
                vars.push((v.clone(), st, shape, buf.len * buf.elem.size(), o));
                o
            }
            (Role::Decoded(input, _), _) => {
                return Err(fail(
                    at,
                    format!("input `{input}` is byte strings, which the library does not take"),
                ))
            }
            (_, Some(o)) => *o,
            (_, None) => return Err(llvm_failed(at, format!("buffer {b} has no place"))),
        };
        if let Role::Input(n) = &buf.role {
            let shape = graph
                .input(n)
                .map_or(vec![buf.len], |x| graph.node(x).ty.shape.to_vec());
            inputs.push(Port {
                name: c_ident(n),
                c_type: c_type(buf.elem),
                view: View::contiguous(b, &shape),
            });
        }
        offsets.push(at_);
    }
    let bytes = end.next_multiple_of(64).max(64);
    let mut outs: Vec<Port> = outputs
        .iter()
        .map(|(n, node)| {
            let view = lowered.views[node].clone();
            Port {
                name: c_ident(n),
                c_type: c_type(bufs[view.buf].elem),
                view,
            }
        })
        .collect();

    parameter_names(&mut inputs, &mut outs);
    let header = header(&id, name, &inputs, &outs);
    let source = source(&id, &offsets, bytes, &kernels, &vars, &inputs, &outs);
    let io = |p: &Path, e: std::io::Error| fail(at, format!("cannot write {}: {e}", p.display()));
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let files = [
        dir.join(format!("{id}.h")),
        dir.join(format!("{id}.c")),
        dir.join(format!("{id}_kernels.o")),
    ];
    for (p, data) in files
        .iter()
        .zip([header.as_bytes(), source.as_bytes(), &object])
    {
        std::fs::write(p, data).map_err(|e| io(p, e))?;
    }
    let lib = dir.join(format!("lib{id}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wl,-z,noexecstack", "-o"])
        .arg(&lib)
        .arg(&files[1])
        .arg(&files[2])
        .output()
        .map_err(|e| fail(at, format!("cannot run the C compiler `{cc}`: {e}")))?;
    if !out.status.success() {
        return Err(fail(
            at,
            format!(
                "the C compiler `{cc}` failed linking {}: {}",
                lib.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let mut all = vec![lib];
    all.extend(files);
    Ok(Library {
        files: all,
        kernels: kernels.len(),
        bytes,
    })
}

/// A C identifier for a name: other characters become `_`.
fn c_ident(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// Makes the parameter names of `predict` distinct C identifiers that clash with no C
/// keyword, standard type or name of the generated code: a clash gains `_`, or a
/// number when two names meet.
fn parameter_names(inputs: &mut [Port], outs: &mut [Port]) {
    const TAKEN: &[&str] = &[
        "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double",
        "else", "enum", "extern", "false", "float", "for", "goto", "if", "inline", "int",
        "int32_t", "int64_t", "long", "model", "register", "restrict", "return", "short", "signed",
        "size_t", "sizeof", "static", "struct", "switch", "true", "typedef", "uint8_t", "uint64_t",
        "union", "unsigned", "void", "volatile", "while",
    ];
    let mut seen = rustc_hash::FxHashSet::default();
    for p in inputs.iter_mut().chain(outs.iter_mut()) {
        if TAKEN.contains(&p.name.as_str()) || p.name.starts_with("est_") {
            p.name.push('_');
        }
        let base = p.name.clone();
        let mut k = 2;
        while !seen.insert(p.name.clone()) {
            p.name = format!("{base}_{k}");
            k += 1;
        }
    }
}

fn c_type(e: Elem) -> &'static str {
    match e {
        Elem::F32 => "float",
        Elem::I32 => "int32_t",
        Elem::U8 => "uint8_t",
        Elem::I64 => "int64_t",
    }
}

fn dims(shape: &[usize]) -> String {
    shape.iter().map(|d| format!("[{d}]")).collect()
}

/// The parameters of `predict`: inputs, then outputs.
fn params(inputs: &[Port], outs: &[Port]) -> String {
    let mut p = String::new();
    for i in inputs {
        let _ = write!(p, ", const {} *{}", i.c_type, i.name);
    }
    for o in outs {
        let _ = write!(p, ", {} *{}", o.c_type, o.name);
    }
    p
}

fn header(id: &str, name: &str, inputs: &[Port], outs: &[Port]) -> String {
    let guard = format!("EST_{}_H", id.to_ascii_uppercase());
    let batch = inputs
        .first()
        .and_then(|i| i.view.shape.first())
        .copied()
        .unwrap_or(1);
    let mut h = format!(
        "/* The predict graph of estimator `{name}`, generated by `estc build --lib`.\n \
         * Link with -l{id}. Not thread-safe per model: one call at a time on each. */\n\
         #ifndef {guard}\n#define {guard}\n\n#include <stddef.h>\n#include <stdint.h>\n\n\
         #ifdef __cplusplus\nextern \"C\" {{\n#endif\n\n\
         /* Every call computes one batch of exactly this many examples. */\n\
         #define EST_{up}_BATCH {batch}\n\n\
         typedef struct est_{id} est_{id};\n\n\
         /* Loads the variables of a checkpoint (`model_dir/ckpt-N.safetensors`), each\n \
         * checked against its CRC32C in the metadata beside it (`ckpt-N.json`): NULL on\n \
         * failure, with the reason in err (err_len bytes; empty after a success). */\n\
         est_{id} *est_{id}_load(const char *checkpoint, char *err, size_t err_len);\n\n\
         /* Runs one batch, arrays in row-major order:\n",
        up = id.to_ascii_uppercase()
    );
    for i in inputs {
        let _ = writeln!(
            h,
            " *   input  {} {}{}",
            i.c_type,
            i.name,
            dims(&i.view.shape)
        );
    }
    for o in outs {
        let _ = writeln!(
            h,
            " *   output {} {}{}",
            o.c_type,
            o.name,
            dims(&o.view.shape)
        );
    }
    let _ = write!(
        h,
        " * Returns 0; 1 after an integer division by zero; 2 when an index (of a gather,\n \
         * an embedding) is out of range. */\n\
         int est_{id}_predict(est_{id} *model{});\n\n\
         void est_{id}_free(est_{id} *model);\n\n\
         #ifdef __cplusplus\n}}\n#endif\n#endif\n",
        params(inputs, outs)
    );
    h
}

/// The CRC32C (Castagnoli) table the loader checks checkpoints with.
fn crc32c_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    for (i, e) in t.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
        }
        *e = c;
    }
    t
}

/// The C side: memory plan, tables, loader (checking checksums), driver.
fn source(
    id: &str,
    offsets: &[usize],
    bytes: usize,
    kernels: &[LibKernel],
    vars: &[(String, &str, Vec<usize>, usize, usize)],
    inputs: &[Port],
    outs: &[Port],
) -> String {
    let list = |it: &mut dyn Iterator<Item = String>| it.collect::<Vec<_>>().join(", ");
    let slots: usize = kernels.iter().map(|k| k.f.bufs.len()).sum();
    let mut s = format!(
        "/* Generated by `estc build --lib`; do not edit. */\n\
         #include \"{id}.h\"\n#include <stdarg.h>\n#include <stdio.h>\n#include <stdlib.h>\n\
         #include <string.h>\n\n"
    );
    for k in kernels.iter().filter(|k| k.c.is_none()) {
        let _ = writeln!(
            s,
            "extern int64_t {}(void *const *, int64_t, int64_t);",
            k.f.name
        );
    }
    s.push('\n');
    for c in kernels.iter().filter_map(|k| k.c.as_deref()) {
        s.push_str(c);
    }
    let _ = write!(
        s,
        "\nstruct est_{id} {{\n  unsigned char *base;\n  void *tab[{}];\n}};\n\n",
        slots.max(1)
    );
    let _ = writeln!(
        s,
        "static const size_t OFFSETS[] = {{{}}};",
        list(&mut offsets.iter().map(|o| o.to_string()))
    );
    let _ = writeln!(
        s,
        "static const size_t TAB[] = {{{}}};",
        list(
            &mut kernels
                .iter()
                .flat_map(|k| k.f.bufs.iter())
                .map(|b| b.to_string())
                .chain(std::iter::once("0".to_string()).filter(|_| slots == 0))
        )
    );
    let mut at = 0;
    let mut starts = Vec::new();
    for k in kernels {
        starts.push(at.to_string());
        at += k.f.bufs.len();
    }
    let _ = writeln!(
        s,
        "static const size_t START[] = {{{}}};",
        list(&mut starts.into_iter())
    );
    let _ = writeln!(
        s,
        "static const int64_t OUTER[] = {{{}}};",
        list(&mut kernels.iter().map(|k| k.outer.to_string()))
    );
    let _ = writeln!(
        s,
        "static int64_t (*const KERNELS[])(void *const *, int64_t, int64_t) = {{{}}};\n",
        list(&mut kernels.iter().map(|k| k.f.name.clone()))
    );
    let _ = writeln!(
        s,
        "static const uint32_t CRC32C[256] = {{{}}};\n",
        list(&mut crc32c_table().iter().map(|c| format!("0x{c:08x}u")))
    );
    s.push_str(
        r#"static void fail(char *err, size_t n, const char *fmt, ...) {
  va_list a;
  if (!err || !n) return;
  va_start(a, fmt);
  vsnprintf(err, n, fmt, a);
  va_end(a);
}

/* Reads tensor `name` of a safetensors file (header `hdr`, data from `data`) into
   `dst`, checking its dtype, shape (`rank` sizes) and size. */
static int read_var(FILE *f, const char *hdr, uint64_t data, const char *name,
                    const char *dtype, const uint64_t *shape, size_t rank, uint64_t bytes,
                    void *dst, char *err, size_t n) {
  char key[1024];
  const char *p, *end, *d, *o, *sh;
  char *q;
  uint64_t lo, hi;
  size_t r;
  snprintf(key, sizeof key, "\"%s\":", name);
  p = strstr(hdr, key);
  if (!p) { fail(err, n, "the checkpoint has no variable `%s`", name); return 0; }
  end = strchr(p, '}');
  d = strstr(p, "\"dtype\":\"");
  o = strstr(p, "\"data_offsets\":[");
  if (!end || !d || d > end || !o || o > end) {
    fail(err, n, "the checkpoint's entry of `%s` is malformed", name);
    return 0;
  }
  d += 9;
  if (strncmp(d, dtype, strlen(dtype)) != 0 || d[strlen(dtype)] != '"') {
    fail(err, n, "variable `%s` is not %s in the checkpoint", name, dtype);
    return 0;
  }
  sh = strstr(p, "\"shape\":[");
  if (!sh || sh > end) {
    fail(err, n, "the checkpoint's entry of `%s` is malformed", name);
    return 0;
  }
  sh += 9;
  for (r = 0;; r++) {
    while (*sh == ' ' || *sh == ',') sh++;
    if (*sh == ']' || r == rank) break;
    lo = strtoull(sh, &q, 10);
    if (q == sh || lo != shape[r]) break;
    sh = q;
  }
  if (r != rank || *sh != ']') {
    fail(err, n, "variable `%s` has another shape in the checkpoint than in this program",
         name);
    return 0;
  }
  lo = strtoull(o + 16, &q, 10);
  hi = strtoull(q + 1, NULL, 10);
  if (hi < lo || hi - lo != bytes) {
    fail(err, n, "variable `%s` has %llu bytes in the checkpoint; the program's has %llu",
         name, (unsigned long long)(hi - lo), (unsigned long long)bytes);
    return 0;
  }
  if (fseek(f, (long)(data + lo), SEEK_SET) != 0 || fread(dst, 1, bytes, f) != bytes) {
    fail(err, n, "the checkpoint ends inside variable `%s`", name);
    return 0;
  }
  return 1;
}

/* The CRC32C (Castagnoli) of `n` bytes, as est's checkpoints hold them. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  size_t i;
  for (i = 0; i < n; i++) c = CRC32C[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/* The text of a checkpoint's metadata (`ckpt-N.json` beside `ckpt-N.safetensors`), or
   NULL after saying why. */
static char *read_meta(const char *checkpoint, char *err, size_t n) {
  char path[4096];
  size_t len = strlen(checkpoint), got;
  const char *ext = ".safetensors";
  long size;
  char *text;
  FILE *f;
  if (len >= strlen(ext) && strcmp(checkpoint + len - strlen(ext), ext) == 0) len -= strlen(ext);
  if (len + 6 > sizeof path) { fail(err, n, "the checkpoint's path is too long"); return NULL; }
  memcpy(path, checkpoint, len);
  memcpy(path + len, ".json", 6);
  f = fopen(path, "rb");
  if (!f) {
    fail(err, n, "cannot open %s, the checkpoint's metadata, which holds its checksums", path);
    return NULL;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || size > (64L << 20) ||
      fseek(f, 0, SEEK_SET) != 0) {
    fail(err, n, "%s is not a checkpoint's metadata", path);
    fclose(f);
    return NULL;
  }
  text = malloc((size_t)size + 1);
  if (!text) { fail(err, n, "out of memory"); fclose(f); return NULL; }
  got = fread(text, 1, (size_t)size, f);
  fclose(f);
  text[got] = 0;
  if (!strstr(text, "\"checksums\"")) {
    fail(err, n, "%s holds no checksums (a checkpoint of an older est: save it again)", path);
    free(text);
    return NULL;
  }
  return text;
}

/* Whether variable `name`'s `bytes` bytes at `p` match its checksum in `meta`. */
static int verify(const char *meta, const char *name, const unsigned char *p, size_t bytes,
                  char *err, size_t n) {
  char key[1024];
  const char *c = strstr(meta, "\"checksums\""), *at;
  char *q;
  unsigned long want;
  snprintf(key, sizeof key, "\"%s\":", name);
  at = strstr(c, key);
  if (!at) { fail(err, n, "the checkpoint's metadata has no checksum of `%s`", name); return 0; }
  at += strlen(key);
  while (*at == ' ') at++;
  want = strtoul(at, &q, 10);
  if (q == at) { fail(err, n, "the checkpoint's metadata has no checksum of `%s`", name); return 0; }
  if ((uint32_t)want != crc32c(p, bytes)) {
    fail(err, n, "the data of `%s` does not match its checksum: the checkpoint is damaged", name);
    return 0;
  }
  return 1;
}

"#,
    );
    let _ = write!(
        s,
        "static est_{id} *load_checked(const char *checkpoint, const char *meta, char *err, size_t err_len) {{\n  \
         unsigned char len8[8];\n  uint64_t hlen = 0;\n  char *hdr;\n  size_t i;\n  int ok = 1;\n  \
         est_{id} *m;\n  FILE *f = fopen(checkpoint, \"rb\");\n  \
         if (!f) {{ fail(err, err_len, \"cannot open %s\", checkpoint); return NULL; }}\n  \
         if (fread(len8, 1, 8, f) != 8) {{ fail(err, err_len, \"%s is not a safetensors file\", checkpoint); fclose(f); return NULL; }}\n  \
         for (i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);\n  \
         if (hlen > (100u << 20)) {{ fail(err, err_len, \"%s is not a safetensors file\", checkpoint); fclose(f); return NULL; }}\n  \
         hdr = malloc(hlen + 1);\n  m = calloc(1, sizeof *m);\n  \
         if (m) m->base = aligned_alloc(64, {bytes});\n  \
         if (!hdr || !m || !m->base) {{ fail(err, err_len, \"out of memory\"); free(hdr); if (m) free(m->base); free(m); fclose(f); return NULL; }}\n  \
         memset(m->base, 0, {bytes});\n  \
         if (fread(hdr, 1, hlen, f) != hlen) ok = 0, fail(err, err_len, \"%s is not a safetensors file\", checkpoint);\n  \
         hdr[hlen] = 0;\n"
    );
    for (k, (name, dtype, shape, len, off)) in vars.iter().enumerate() {
        let lit = name.replace('\\', "\\\\").replace('"', "\\\"");
        let sizes = shape.iter().map(|d| d.to_string()).collect::<Vec<_>>();
        let _ = writeln!(
            s,
            "  {{\n    static const uint64_t est_shape{k}[] = {{{}}};\n    \
             ok = ok && read_var(f, hdr, 8 + hlen, \"{lit}\", \"{dtype}\", est_shape{k}, {}, {len}, m->base + {off}, err, err_len)\n      \
             && verify(meta, \"{lit}\", m->base + {off}, {len}, err, err_len);\n  }}",
            if sizes.is_empty() { "0".to_string() } else { sizes.join(", ") },
            shape.len()
        );
    }
    let _ = write!(
        s,
        "  free(hdr);\n  fclose(f);\n  \
         if (!ok) {{ est_{id}_free(m); return NULL; }}\n  \
         for (i = 0; i < {slots}; i++) m->tab[i] = m->base + OFFSETS[TAB[i]];\n  \
         return m;\n}}\n\n\
         est_{id} *est_{id}_load(const char *checkpoint, char *err, size_t err_len) {{\n  \
         char *meta;\n  est_{id} *m;\n  \
         if (err && err_len) err[0] = 0;\n  \
         meta = read_meta(checkpoint, err, err_len);\n  \
         if (!meta) return NULL;\n  \
         m = load_checked(checkpoint, meta, err, err_len);\n  \
         free(meta);\n  \
         return m;\n}}\n\n\
         int est_{id}_predict(est_{id} *est_m{}) {{\n  size_t est_k;\n",
        params(inputs, outs)
    );
    for i in inputs {
        let _ = writeln!(
            s,
            "  memcpy(est_m->base + OFFSETS[{}], {}, sizeof(*{}) * {});",
            i.view.buf,
            i.name,
            i.name,
            i.view.len()
        );
    }
    let _ = writeln!(
        s,
        "  for (est_k = 0; est_k < {}; est_k++) {{\n    \
         int64_t est_r = KERNELS[est_k](est_m->tab + START[est_k], 0, OUTER[est_k]);\n    \
         if (est_r != 0) return (int)est_r;\n  }}",
        kernels.len()
    );
    for o in outs {
        let v = &o.view;
        let _ = write!(
            s,
            "  {{\n    const {t} *est_s = (const {t} *)(est_m->base + OFFSETS[{}]);\n    size_t est_o = 0;\n",
            v.buf,
            t = o.c_type
        );
        let mut index = v.offset.to_string();
        for (k, (&d, &st)) in v.shape.iter().zip(&v.strides).enumerate() {
            let _ = writeln!(
                s,
                "    for (int64_t est_i{k} = 0; est_i{k} < {d}; est_i{k}++)"
            );
            let _ = write!(index, " + est_i{k} * {st}");
        }
        let _ = writeln!(s, "    {}[est_o++] = est_s[{index}];\n  }}", o.name);
    }
    let _ = write!(
        s,
        "  return 0;\n}}\n\n\
         void est_{id}_free(est_{id} *m) {{\n  if (m) {{ free(m->base); free(m); }}\n}}\n"
    );
    s
}
