//! A program: the root file and every module it imports, transitively, parsed. `std.*`
//! modules are the files of `stdlib/`, embedded in the binary; other module paths name
//! files relative to the importing file (`use lib.layers` reads `lib/layers.est`).

use crate::diag::{did_you_mean, Code, Diag, Diags};
use crate::span::{FileId, SourceFile, SourceMap, Span};
use crate::syntax::ast::{self, ItemKind};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

/// The standard library, embedded: (module path, file name, text).
pub const STDLIB: &[(&str, &str, &str)] = &[
    (
        "std.prim",
        "stdlib/prim.est",
        include_str!("../stdlib/prim.est"),
    ),
    (
        "std.data",
        "stdlib/data.est",
        include_str!("../stdlib/data.est"),
    ),
    (
        "std.optim",
        "stdlib/optim.est",
        include_str!("../stdlib/optim.est"),
    ),
    ("std.nn", "stdlib/nn.est", include_str!("../stdlib/nn.est")),
    (
        "std.losses",
        "stdlib/losses.est",
        include_str!("../stdlib/losses.est"),
    ),
    (
        "std.metrics",
        "stdlib/metrics.est",
        include_str!("../stdlib/metrics.est"),
    ),
    (
        "std.image",
        "stdlib/image.est",
        include_str!("../stdlib/image.est"),
    ),
    (
        "std.hooks",
        "stdlib/hooks.est",
        include_str!("../stdlib/hooks.est"),
    ),
];

/// Modules whose items every module sees without `use`.
pub const PRELUDE: &[&str] = &["std.prim", "std.data", "std.optim"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModId(pub u32);

/// What a name at module level refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Def {
    /// Item number `usize` of a module.
    Item(ModId, usize),
    Module(ModId),
}

#[derive(Debug)]
pub struct Module {
    pub path: String,
    pub file: FileId,
    pub ast: ast::Module,
    pub is_std: bool,
    /// The module's own named items.
    pub items: FxHashMap<String, usize>,
    /// Every name a `use` of this module introduces, whether or not it resolved (uses
    /// of a failed import are not reported again).
    pub import_names: rustc_hash::FxHashSet<String>,
    /// Names brought in by `use`, with the span of the `use` and whether it is `pub`.
    pub imports: FxHashMap<String, (Def, Span, bool)>,
    /// Directory that relative imports of this module start from.
    dir: Option<PathBuf>,
}

#[derive(Debug)]
pub struct Program {
    pub sources: SourceMap,
    pub modules: Vec<Module>,
    pub root: ModId,
    pub diags: Diags,
    /// `--param` and params-file overrides, parsed (see `add_override`).
    pub overrides: Vec<crate::elab::ParamOverride>,
    /// Where `--config` (and a params file's `runconfig:`) set a config key: the span of
    /// its text, a source file of its own, for diagnostics about the value it set (see
    /// `add_config_source`).
    pub config_sources: Vec<(String, Span)>,
    /// False during the quiet rounds of import resolution.
    reporting: bool,
    /// Where imported files' text comes from before the file system (an editor's open
    /// documents).
    overlay: Option<OverlayFn>,
    /// The largest imported file read (`MAX_SOURCE_BYTES`, less in tests).
    max_source_bytes: u64,
    /// Imported files that could not be read, by key, with why: each is read once, not
    /// in every round of import resolution.
    unreadable: FxHashMap<String, (String, &'static str)>,
}

/// An `Overlay` in a `Program` (which is `Debug`).
struct OverlayFn(Overlay);

impl std::fmt::Debug for OverlayFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Overlay")
    }
}

/// Text of files that takes the place of the file system's (for the language server),
/// and of standard modules, asked for by their name (`stdlib/nn.est`).
pub type Overlay = std::sync::Arc<dyn Fn(&Path) -> Option<String> + Send + Sync>;

/// The cache key of a module file: its canonical path.
fn file_key(f: &Path) -> String {
    let canon = std::fs::canonicalize(f).unwrap_or_else(|_| f.to_path_buf());
    format!("file:{}", canon.display())
}

/// An error before any diagnostics: the root file cannot be read.
#[derive(Debug)]
pub struct LoadError(pub String);

/// The largest source file `estc` reads, in bytes (16 MiB). A larger file, or an endless
/// one such as `/dev/zero`, is refused after reading one byte more than this, not read
/// whole; spans count bytes in 32 bits, far above it.
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// Why a text file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// Larger than the limit (in bytes).
    TooLarge(u64),
    /// Not UTF-8: the 1-based line and the 0-based byte offset of the first bad byte.
    NotUtf8 {
        line: usize,
        byte: usize,
    },
    Io(std::io::Error),
}

impl ReadError {
    /// Why, for a message about a `what` (`source file`, `params file`).
    pub fn describe(&self, what: &str) -> String {
        match self {
            ReadError::TooLarge(limit) => {
                format!("it is larger than {}, the limit of a {what}", size(*limit))
            }
            ReadError::NotUtf8 { line, byte } => {
                format!("it is not UTF-8 text (line {line}, byte {byte})")
            }
            ReadError::Io(e) => e.to_string(),
        }
    }
}

/// A size in bytes as people write it: `16 MiB`, `100 bytes`.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// Reads a UTF-8 text file of at most `limit` bytes, without reading more than one
/// byte past the limit.
pub fn read_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    read_text_from(file, limit)
}

/// Reads UTF-8 text of at most `limit` bytes from `r` (standard input, say), without
/// reading more than one byte past the limit.
pub fn read_text_from(r: impl std::io::Read, limit: u64) -> Result<String, ReadError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    r.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    String::from_utf8(bytes).map_err(|e| {
        let byte = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..byte].iter().filter(|&&b| b == b'\n').count();
        ReadError::NotUtf8 { line, byte }
    })
}

/// How a module path failed to give a module.
enum NoModule {
    /// No file or standard module has that path.
    Missing,
    /// Its file exists but cannot be read: the file (relative to the importing
    /// file's directory, as the `use` names it), why, and what to do.
    Unreadable(String, String, &'static str),
}

impl Program {
    /// Loads the program rooted at `path`.
    pub fn load(path: &Path) -> Result<Program, LoadError> {
        let text = read_text(path, MAX_SOURCE_BYTES).map_err(|e| {
            let help = match e {
                ReadError::TooLarge(_) => "; split it into modules (see `use`)",
                ReadError::NotUtf8 { .. } => "; save it as UTF-8",
                ReadError::Io(_) => "",
            };
            LoadError(format!(
                "cannot read {}: {}{help}",
                path.display(),
                e.describe("source file")
            ))
        })?;
        let dir = path.parent().map(Path::to_path_buf);
        Ok(Program::build(
            &path.display().to_string(),
            &text,
            dir,
            Some(path.to_path_buf()),
            None,
            MAX_SOURCE_BYTES,
        ))
    }

    /// Loads a program from text; relative imports are resolved from `dir`, if given.
    pub fn from_source(name: &str, text: &str, dir: Option<PathBuf>) -> Program {
        Program::build(name, text, dir, None, None, MAX_SOURCE_BYTES)
    }

    /// `from_source` with another limit on the size of imported files than
    /// `MAX_SOURCE_BYTES` (for tests of the limit without files of 16 MiB).
    pub fn from_source_with_limit(
        name: &str,
        text: &str,
        dir: Option<PathBuf>,
        max_source_bytes: u64,
    ) -> Program {
        Program::build(name, text, dir, None, None, max_source_bytes)
    }

    /// Loads the program rooted at `path` whose text is `text`; imported files are read
    /// from `overlay` first, then from the file system.
    pub fn load_with(path: &Path, text: &str, overlay: Overlay) -> Program {
        let dir = path.parent().map(Path::to_path_buf);
        Program::build(
            &path.display().to_string(),
            text,
            dir,
            Some(path.to_path_buf()),
            Some(OverlayFn(overlay)),
            MAX_SOURCE_BYTES,
        )
    }

    /// The user files (not the standard library) the program loaded.
    pub fn user_files(&self) -> Vec<(FileId, PathBuf)> {
        self.modules
            .iter()
            .filter(|m| !m.is_std)
            .map(|m| (m.file, PathBuf::from(self.sources.get(m.file).name.clone())))
            .collect()
    }

    fn build(
        name: &str,
        text: &str,
        dir: Option<PathBuf>,
        root_file: Option<PathBuf>,
        overlay: Option<OverlayFn>,
        max_source_bytes: u64,
    ) -> Program {
        let mut p = Program {
            sources: SourceMap::default(),
            modules: Vec::new(),
            root: ModId(0),
            diags: Diags::default(),
            overrides: Vec::new(),
            config_sources: Vec::new(),
            reporting: true,
            overlay,
            max_source_bytes,
            unreadable: FxHashMap::default(),
        };
        let mut by_path: FxHashMap<String, ModId> = FxHashMap::default();
        let root_key = match &root_file {
            Some(f) => file_key(f),
            None => "main".to_string(),
        };
        p.root = p.add_module("main".to_string(), name, text, false, dir);
        by_path.insert(root_key, p.root);
        for prelude in PRELUDE {
            p.module_by_path(prelude, &mut by_path);
        }
        // Imports may name items that other modules re-export with `pub use`: resolve
        // every module's imports until nothing changes, quietly, then once more,
        // reporting what still does not resolve.
        p.reporting = false;
        let mut last = (0, 0);
        for _ in 0..64 {
            for m in 0..p.modules.len() {
                p.resolve_imports(ModId(m as u32), &mut by_path);
            }
            let now = (
                p.modules.len(),
                p.modules.iter().map(|m| m.imports.len()).sum::<usize>(),
            );
            if now == last {
                break;
            }
            last = now;
        }
        p.reporting = true;
        for m in 0..p.modules.len() {
            p.resolve_imports(ModId(m as u32), &mut by_path);
        }
        p
    }

    /// Reports a diagnostic of module loading, unless in a quiet round.
    fn report(&mut self, d: Diag) {
        if self.reporting {
            self.diags.push(d);
        }
    }

    fn add_module(
        &mut self,
        path: String,
        name: &str,
        text: &str,
        is_std: bool,
        dir: Option<PathBuf>,
    ) -> ModId {
        let file = self.sources.add(SourceFile::new(name, text));
        let (ast, diags) = crate::syntax::parse(file, text);
        self.diags.extend(diags);
        let mut items: FxHashMap<String, usize> = FxHashMap::default();
        let mut estimators: FxHashMap<String, usize> = FxHashMap::default();
        for (i, item) in ast.items.iter().enumerate() {
            let Some(n) = item.name() else { continue };
            // Estimators are run by name, never referred to: they have their own namespace.
            let names = if matches!(item.kind, ItemKind::Estimator(_)) {
                &mut estimators
            } else {
                &mut items
            };
            if let Some(&prev) = names.get(&n.name) {
                let prev_span = ast.items[prev].name().map_or(item.span, |p| p.span);
                self.diags.push(
                    Diag::new(
                        Code::DuplicateDefinition,
                        n.span,
                        format!("`{}` is defined twice", n.name),
                    )
                    .label("second definition")
                    .with(prev_span, "first definition")
                    .help("rename or remove one of them"),
                );
            } else {
                names.insert(n.name.clone(), i);
            }
        }
        let import_names = ast
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                ItemKind::Use(u) => Some(u),
                _ => None,
            })
            .flat_map(|u| match (&u.names, &u.alias) {
                (Some(ns), _) => ns.iter().map(|n| n.name.clone()).collect::<Vec<_>>(),
                (None, Some(a)) => vec![a.name.clone()],
                (None, None) => u
                    .path
                    .last()
                    .map(|n| vec![n.name.clone()])
                    .unwrap_or_default(),
            })
            .collect();
        self.modules.push(Module {
            path,
            file,
            ast,
            import_names,
            is_std,
            items,
            imports: FxHashMap::default(),
            dir,
        });
        ModId(self.modules.len() as u32 - 1)
    }

    /// Finds or loads the module with a dotted path. `None` if there is no such module.
    fn module_by_path(
        &mut self,
        path: &str,
        by_path: &mut FxHashMap<String, ModId>,
    ) -> Option<ModId> {
        self.module_from(path, None, by_path).ok()
    }

    fn module_from(
        &mut self,
        path: &str,
        from: Option<ModId>,
        by_path: &mut FxHashMap<String, ModId>,
    ) -> Result<ModId, NoModule> {
        if let Some(&m) = by_path.get(path) {
            return Ok(m);
        }
        if let Some((_, file, text)) = STDLIB.iter().find(|(p, _, _)| *p == path) {
            let replaced = self.overlay.as_ref().and_then(|o| (o.0)(Path::new(file)));
            let text = replaced.as_deref().unwrap_or(text);
            let m = self.add_module(path.to_string(), file, text, true, None);
            by_path.insert(path.to_string(), m);
            return Ok(m);
        }
        if path.starts_with("std.") || path == "std" {
            return Err(NoModule::Missing);
        }
        let dir = from
            .and_then(|f| self.modules[f.0 as usize].dir.clone())
            .ok_or(NoModule::Missing)?;
        let rel = format!("{}.est", path.replace('.', "/"));
        let file = dir.join(&rel);
        let key = file_key(&file);
        if let Some(&m) = by_path.get(&key) {
            return Ok(m);
        }
        if let Some((why, help)) = self.unreadable.get(&key) {
            return Err(NoModule::Unreadable(rel, why.clone(), help));
        }
        let text = match self.overlay.as_ref().and_then(|o| (o.0)(&file)) {
            Some(t) => t,
            None => match read_text(&file, self.max_source_bytes) {
                Ok(t) => t,
                Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(NoModule::Missing)
                }
                Err(e) => {
                    let why = e.describe("source file");
                    let help = match e {
                        ReadError::TooLarge(_) => {
                            "split the module into smaller files, each imported with `use`"
                        }
                        ReadError::NotUtf8 { .. } => "save the file as UTF-8 text",
                        ReadError::Io(_) => "check that the file is a readable text file",
                    };
                    self.unreadable.insert(key, (why.clone(), help));
                    return Err(NoModule::Unreadable(rel, why, help));
                }
            },
        };
        let m = self.add_module(
            path.to_string(),
            &file.display().to_string(),
            &text,
            false,
            file.parent().map(Path::to_path_buf),
        );
        by_path.insert(key, m);
        Ok(m)
    }

    fn resolve_imports(&mut self, m: ModId, by_path: &mut FxHashMap<String, ModId>) {
        let uses: Vec<ast::UseItem> = self.modules[m.0 as usize]
            .ast
            .items
            .iter()
            .filter_map(|i| match &i.kind {
                ItemKind::Use(u) => Some(u.clone()),
                _ => None,
            })
            .collect();
        for u in uses {
            self.resolve_use(m, &u, by_path);
        }
    }

    fn resolve_use(&mut self, m: ModId, u: &ast::UseItem, by_path: &mut FxHashMap<String, ModId>) {
        let full: Vec<&str> = u.path.iter().map(|i| i.name.as_str()).collect();
        let path_span = u.path[0].span.to(u.path[u.path.len() - 1].span);
        match &u.names {
            Some(names) => {
                let target = match self.module_from(&full.join("."), Some(m), by_path) {
                    Ok(t) => t,
                    Err(no) => return self.no_module(&full.join("."), path_span, no),
                };
                for n in names {
                    if let Some(def) = self.member_or_report(target, &n.name, n.span) {
                        self.bind_import(m, n, def, u.public);
                    }
                }
            }
            None => {
                let alias = u.alias.as_ref().unwrap_or(&u.path[u.path.len() - 1]);
                match self.module_from(&full.join("."), Some(m), by_path) {
                    Ok(target) => {
                        self.bind_import(m, alias, Def::Module(target), u.public);
                        return;
                    }
                    Err(no @ NoModule::Unreadable(..)) => {
                        return self.no_module(&full.join("."), path_span, no)
                    }
                    Err(NoModule::Missing) => {}
                }
                if full.len() < 2 {
                    self.unknown_module(&full.join("."), path_span);
                    return;
                }
                let parent = full[..full.len() - 1].join(".");
                let parent_span = u.path[0].span.to(u.path[u.path.len() - 2].span);
                let target = match self.module_from(&parent, Some(m), by_path) {
                    Ok(t) => t,
                    Err(no) => return self.no_module(&parent, parent_span, no),
                };
                let last = &u.path[u.path.len() - 1];
                if let Some(def) = self.member_or_report(target, &last.name, last.span) {
                    self.bind_import(m, alias, def, u.public);
                }
            }
        }
    }

    /// Reports a module path that gave no module: E0202 when nothing has that path,
    /// E0105 when its file exists but cannot be read.
    fn no_module(&mut self, path: &str, span: Span, no: NoModule) {
        match no {
            NoModule::Missing => self.unknown_module(path, span),
            NoModule::Unreadable(file, why, help) => {
                self.report(
                    Diag::new(
                        Code::UnreadableModule,
                        span,
                        format!("cannot read {file}, the file of module `{path}`: {why}"),
                    )
                    .label("imported here")
                    .help(help),
                );
            }
        }
    }

    fn bind_import(&mut self, m: ModId, name: &ast::Ident, def: Def, public: bool) {
        let module = &mut self.modules[m.0 as usize];
        if let Some(&i) = module.items.get(&name.name) {
            let item_span = module.ast.items[i].name().map_or(name.span, |n| n.span);
            self.report(
                Diag::new(
                    Code::DuplicateDefinition,
                    name.span,
                    format!("`{}` is imported and also defined here", name.name),
                )
                .label("imported here")
                .with(item_span, "defined here")
                .help("import it under another name with `as`, or rename the item"),
            );
            return;
        }
        if let Some((prev, prev_span, _)) = module.imports.get(&name.name) {
            if *prev != def {
                let prev_span = *prev_span;
                self.report(
                    Diag::new(
                        Code::DuplicateDefinition,
                        name.span,
                        format!("`{}` is imported twice", name.name),
                    )
                    .label("second import")
                    .with(prev_span, "first import")
                    .help("import one of them under another name with `as`"),
                );
            }
            return;
        }
        module
            .imports
            .insert(name.name.clone(), (def, name.span, public));
    }

    fn unknown_module(&mut self, path: &str, span: Span) {
        let std_names = STDLIB.iter().map(|(p, _, _)| *p);
        let mut d =
            Diag::new(Code::UnknownModule, span, format!("no module `{path}`")).label("not found");
        d = match did_you_mean(path, std_names) {
            Some(h) => d.help(h),
            None => d.help("std modules: std.nn, std.losses, std.metrics, std.optim, std.data, std.hooks, std.prim; other paths are files relative to this one"),
        };
        self.report(d);
    }

    fn member_or_report(&mut self, m: ModId, name: &str, span: Span) -> Option<Def> {
        if let Some(d) = self.member(m, name) {
            return Some(d);
        }
        let module = &self.modules[m.0 as usize];
        let mut names: Vec<&str> = module.items.keys().map(String::as_str).collect();
        names.extend(
            module
                .imports
                .iter()
                .filter(|(_, (_, _, p))| *p)
                .map(|(k, _)| k.as_str()),
        );
        let mut d = Diag::new(
            Code::UnknownItem,
            span,
            format!("`{}` has no item `{name}`", module.path),
        )
        .label("not found");
        if let Some(h) = did_you_mean(name, names) {
            d = d.help(h);
        } else {
            d = d.help(format!("see `{}` for its items", module.path));
        }
        self.report(d);
        None
    }

    /// A module's public member: its items and its `pub use` imports.
    pub fn member(&self, m: ModId, name: &str) -> Option<Def> {
        let module = &self.modules[m.0 as usize];
        if let Some(&i) = module.items.get(name) {
            return Some(Def::Item(m, i));
        }
        match module.imports.get(name) {
            Some((def, _, true)) => Some(*def),
            _ => None,
        }
    }

    /// The function, input or model a call's callee names at the top level of module
    /// `m`: `name`, or `name.member` where `name` is a module.
    pub fn callee(&self, m: ModId, name: &str, member: Option<&str>) -> Option<&ast::FnItem> {
        let def = match (self.lookup(m, name)?, member) {
            (d, None) => d,
            (Def::Module(inner), Some(member)) => self.member(inner, member)?,
            (Def::Item(..), Some(_)) => return None,
        };
        let Def::Item(m, i) = def else { return None };
        match &self.item(m, i).kind {
            ast::ItemKind::Fn(f) | ast::ItemKind::Input(f) | ast::ItemKind::Model(f) => Some(f),
            _ => None,
        }
    }

    /// What a name means at the top level of module `m`: its items, its imports, then
    /// the prelude.
    pub fn lookup(&self, m: ModId, name: &str) -> Option<Def> {
        let module = &self.modules[m.0 as usize];
        if let Some(&i) = module.items.get(name) {
            return Some(Def::Item(m, i));
        }
        if let Some((def, _, _)) = module.imports.get(name) {
            return Some(*def);
        }
        PRELUDE.iter().find_map(|p| {
            let pm = self.modules.iter().position(|x| x.path == *p)?;
            self.member(ModId(pm as u32), name)
        })
    }

    /// Adds a params override: `value` is est source (`0.1`, `[128, 64]`, `"adam"`),
    /// kept as a file of its own named `origin` so diagnostics can point into it.
    pub fn add_override(&mut self, key: &str, value: &str, origin: &str) {
        let file = self.sources.add(SourceFile::new(origin, value));
        let (expr, diags) = crate::syntax::parse_expr(file, value);
        // However the value fails to parse, the problem is a bad override.
        self.diags.extend(diags.into_iter().map(|mut d| {
            d.message = format!("bad override of `{key}`: {}", d.message);
            d.code = Code::InvalidParamOverride;
            d
        }));
        self.overrides.push(crate::elab::ParamOverride {
            key: key.to_string(),
            value: expr,
        });
    }

    /// Records that `text` (`save_checkpoint_steps=20`), from `origin` (`--config`), sets
    /// config key `key`, as a source file of its own that diagnostics about the key
    /// point at instead of the program's `config` block.
    pub fn add_config_source(&mut self, key: &str, text: &str, origin: &str) {
        let file = self.sources.add(SourceFile::new(origin, text));
        self.config_sources
            .push((key.to_string(), Span::new(file, 0, text.len())));
    }

    pub fn module(&self, m: ModId) -> &Module {
        &self.modules[m.0 as usize]
    }

    pub fn item(&self, m: ModId, i: usize) -> &ast::Item {
        &self.modules[m.0 as usize].ast.items[i]
    }

    pub fn is_std_file(&self, f: FileId) -> bool {
        self.modules.iter().any(|m| m.file == f && m.is_std)
    }

    /// The directory of the root file, which the program's data paths start from.
    pub fn root_dir(&self) -> Option<&Path> {
        self.root_module().dir.as_deref()
    }

    pub fn root_module(&self) -> &Module {
        self.module(self.root)
    }
}
