//! A guard against pathologically deep nesting. Later stages walk the tree recursively;
//! an item nested deeper than `MAX_DEPTH` (no real program comes close) is reported and
//! replaced by an error node. The depth is measured without recursion, and the removed
//! subtree is dropped on a thread with a large stack, so no input overflows the stack.

use super::ast::*;
use crate::diag::{Code, Diag};

/// How deeply expressions, blocks and statements may nest within one item.
pub const MAX_DEPTH: usize = 256;

enum Node<'a> {
    Expr(&'a Expr),
    Block(&'a Block),
    Stmt(&'a Stmt),
    If(&'a IfStmt),
    Type(&'a TypeExpr),
}

fn children<'a>(n: &Node<'a>, out: &mut Vec<Node<'a>>) {
    match n {
        Node::Expr(e) => match &e.kind {
            ExprKind::List(xs) | ExprKind::Tuple(xs) => out.extend(xs.iter().map(Node::Expr)),
            ExprKind::Record(fs) => out.extend(fs.iter().map(|(_, x)| Node::Expr(x))),
            ExprKind::Field(b, _) | ExprKind::Unary(_, b) => out.push(Node::Expr(b)),
            ExprKind::Index(b, ix) => {
                out.push(Node::Expr(b));
                out.extend(ix.iter().map(Node::Expr));
            }
            ExprKind::Call { callee, args, .. } => {
                out.push(Node::Expr(callee));
                out.extend(args.iter().map(|a| Node::Expr(&a.value)));
            }
            ExprKind::Binary(_, a, b) | ExprKind::Range(a, b) => {
                out.push(Node::Expr(a));
                out.push(Node::Expr(b));
            }
            ExprKind::Closure { body, .. } => out.push(Node::Expr(body)),
            ExprKind::If(i) => out.push(Node::If(i)),
            _ => {}
        },
        Node::Block(b) => {
            out.extend(b.stmts.iter().map(Node::Stmt));
            out.extend(b.tail.iter().map(|t| Node::Expr(t)));
        }
        Node::Stmt(s) => match &s.kind {
            StmtKind::Let { ty, value, .. } => {
                out.extend(ty.iter().map(Node::Type));
                out.push(Node::Expr(value));
            }
            StmtKind::Assign { value, .. }
            | StmtKind::Metric { value, .. }
            | StmtKind::Expr(value) => out.push(Node::Expr(value)),
            StmtKind::For { iter, body, .. } => {
                out.push(Node::Expr(iter));
                out.push(Node::Block(body));
            }
            StmtKind::If(i) => out.push(Node::If(i)),
            StmtKind::Section { body, .. } => out.push(Node::Block(body)),
            StmtKind::Minimize { loss, optimizer } => {
                out.push(Node::Expr(loss));
                out.push(Node::Expr(optimizer));
            }
            StmtKind::Error => {}
        },
        Node::If(i) => {
            out.push(Node::Expr(&i.cond));
            out.push(Node::Block(&i.then));
            match &i.otherwise {
                Some(Else::Block(b)) => out.push(Node::Block(b)),
                Some(Else::If(inner, _)) => out.push(Node::If(inner)),
                None => {}
            }
        }
        Node::Type(t) => match t {
            TypeExpr::Named { dims: Some(d), .. } => out.extend(d.iter().map(Node::Expr)),
            TypeExpr::Named { dims: None, .. } => {}
            _ => out.extend(t.parts().into_iter().map(Node::Type)),
        },
    }
}

fn roots(item: &Item) -> Vec<Node<'_>> {
    match &item.kind {
        ItemKind::Fn(f) | ItemKind::Input(f) | ItemKind::Model(f) => {
            let mut v: Vec<Node<'_>> = Vec::new();
            for p in &f.params {
                v.extend(p.ty.iter().map(Node::Type));
                v.extend(p.default.iter().map(Node::Expr));
            }
            v.extend(f.body.iter().map(Node::Block));
            v
        }
        ItemKind::Params(fs) => fs
            .iter()
            .flat_map(|f| [Node::Type(&f.ty), Node::Expr(&f.default)])
            .collect(),
        ItemKind::Estimator(e) => {
            let mut v = Vec::new();
            let mut stack: Vec<&Field> = e.fields.iter().collect();
            while let Some(f) = stack.pop() {
                match &f.value {
                    FieldValue::Expr(x) => v.push(Node::Expr(x)),
                    FieldValue::Block(fs, _) => stack.extend(fs.iter()),
                }
            }
            v
        }
        ItemKind::Use(_) | ItemKind::Error(_) => Vec::new(),
    }
}

/// Calls `f` on every node of an item with its depth (the roots at 1), without
/// recursion.
fn walk<'a>(item: &'a Item, mut f: impl FnMut(&Node<'a>, usize)) {
    let mut stack: Vec<(Node<'_>, usize)> = roots(item).into_iter().map(|n| (n, 1)).collect();
    let mut kids = Vec::new();
    while let Some((n, d)) = stack.pop() {
        f(&n, d);
        children(&n, &mut kids);
        stack.extend(kids.drain(..).map(|k| (k, d + 1)));
    }
}

/// Calls `f` on every expression of an item, without recursion.
pub fn each_expr<'a>(item: &'a Item, mut f: impl FnMut(&'a Expr)) {
    walk(item, |n, _| {
        if let Node::Expr(e) = n {
            f(e);
        }
    });
}

/// The deepest nesting in an item, counted without recursion.
pub fn depth(item: &Item) -> usize {
    let mut max = 0;
    walk(item, |_, d| max = max.max(d));
    max
}

/// Replaces every item nested deeper than `MAX_DEPTH` by an error node.
pub fn limit(module: &mut Module, diags: &mut Vec<Diag>) {
    let mut removed = Vec::new();
    for item in &mut module.items {
        let d = depth(item);
        if d > MAX_DEPTH {
            diags.push(
                Diag::new(
                    Code::SyntaxError,
                    crate::span::Span {
                        hi: item.span.lo + 1,
                        ..item.span
                    },
                    format!("this item nests {d} levels deep"),
                )
                .label(format!(
                    "more than {MAX_DEPTH} levels of nested expressions and blocks"
                ))
                .help("split the expression with `let` bindings or helper functions"),
            );
            let name = item.name().cloned();
            removed.push(std::mem::replace(&mut item.kind, ItemKind::Error(name)));
        }
    }
    if !removed.is_empty() {
        // Dropping a deep tree recurses once per level.
        let dropper = std::thread::Builder::new()
            .stack_size(1 << 30)
            .spawn(move || drop(removed));
        if let Ok(h) = dropper {
            let _ = h.join();
        }
    }
}
