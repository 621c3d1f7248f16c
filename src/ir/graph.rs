//! The IR graph: a `StableDiGraph` of nodes (op, concrete type, source span); an edge
//! runs from an operand to its user and carries the operand's index. Beside the nodes,
//! a graph lists what the program reads from it: outputs, metrics and the optimiser.

use super::{Init, Op, TensorType};
use crate::span::Span;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::{EdgeRef, IntoEdgeReferences, NodeIndexable};
use petgraph::Direction;

/// A node's operands, in order.
pub type Operands = smallvec::SmallVec<[NodeIndex; 4]>;

#[derive(Debug, Clone)]
pub struct Node {
    pub op: Op,
    pub ty: TensorType,
    /// Where in the user's program this node comes from (the call site in user code
    /// when the op was made inside a standard-library function).
    pub span: Span,
}

/// What an output of the graph is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Loss,
    LearningRate,
    Prediction,
    /// One argument of a metric (see `Graph::metrics`).
    MetricInput,
    /// The new value of a non-trainable variable after a train step (named by it).
    Update,
    /// A tensor of a dataset element, in the graph of a `map` or `filter` closure.
    Element,
    /// The global step after a train step (made by autodiff: the step plus one).
    NextStep,
    /// The gradient of a trainable variable, averaged over shards (named by the
    /// variable; made by autodiff, so that the runtime can check it is finite).
    Gradient,
    /// The gradient of a trainable variable whose optimiser has a dynamic loss scale:
    /// as `Gradient`, but a NaN or infinity in it skips the step instead of failing it.
    ScaledGradient,
    /// A value written to TensorBoard with the train summaries (named by its tag):
    /// the regularisation loss.
    Summary,
}

#[derive(Debug, Clone)]
pub struct Output {
    pub name: String,
    pub role: Role,
    pub node: NodeIndex,
}

/// A metric: a reducer (accuracy, mean, auc, ...) over some outputs.
#[derive(Debug, Clone)]
pub struct Metric {
    pub name: String,
    pub reducer: String,
    /// Indices into `Graph::outputs`.
    pub args: Vec<usize>,
    pub span: Span,
}

/// The optimiser of a train graph; its learning rate is the `LearningRate` output.
#[derive(Debug, Clone)]
pub struct Optimizer {
    pub kind: String,
    pub hyper: Vec<(String, f64)>,
    pub clip_global_norm: Option<f64>,
    /// Name patterns of the variables a decoupled weight decay skips (`adamw`'s
    /// `exclude_from_weight_decay`; see `name_matches`).
    pub decay_exclude: Vec<String>,
    /// The names of the outputs of the loss it minimises and of its learning rate
    /// (`loss` and `learning_rate` for the first `minimize`).
    pub loss: String,
    pub learning_rate: String,
    /// The variables it updates (`only(...)`); `None`: every trainable variable no
    /// other optimiser of the graph names.
    pub variables: Option<Vec<String>>,
    /// `moving_average(...)`: the decay of the exponential moving averages of the
    /// variables it updates, and whether the decay ramps up with the global step.
    pub moving_average: Option<(f64, bool)>,
    /// `loss_scale(...)`: the loss is multiplied by a scale before differentiation and
    /// the gradients divided by it (mixed precision keeps small f16 gradients from
    /// flushing to zero).
    pub loss_scale: Option<LossScale>,
    pub span: Span,
}

/// How `loss_scale` scales (Keras's `LossScaleOptimizer`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScale {
    /// Always this scale.
    Fixed(f64),
    /// Starting at `initial`: a step whose gradients are not all finite is skipped
    /// (no variable or slot changes) and halves the scale (not below 1); after
    /// `growth_interval` finite steps in a row, the scale doubles. The scale and the
    /// count are the variables `LOSS_SCALE` and `GOOD_STEPS` (per optimiser: `/k`
    /// after the first).
    Dynamic { initial: f64, growth_interval: u64 },
}

/// The variables of a dynamic loss scale (Keras's names).
pub const LOSS_SCALE: &str = "LossScaleOptimizer/current_loss_scale";
pub const GOOD_STEPS: &str = "LossScaleOptimizer/good_steps";

/// The suffix of the variable holding another's exponential moving average
/// (TensorFlow's name).
pub const AVERAGE_SUFFIX: &str = "/ExponentialMovingAverage";

/// Makes the variables of `g` that have a moving average in `averaged` (the names of
/// the train graph's average variables) read their averages: eval and predict on the
/// averaged weights, as MobileNet's recipe evaluates.
pub fn read_averages(g: &mut Graph, averaged: &[String]) {
    for n in g.g.node_indices().collect::<Vec<_>>() {
        if let Op::Variable { name, init, .. } = &g.g[n].op {
            let avg = format!("{name}{AVERAGE_SUFFIX}");
            if averaged.contains(&avg) {
                let init = Init::As {
                    init: Box::new(init.clone()),
                    name: name.clone(),
                };
                g.g[n].op = Op::Variable {
                    name: avg,
                    init,
                    trainable: false,
                };
            }
        }
    }
}

/// Whether a variable's name matches a pattern: the name contains the pattern, where a
/// `*` in it stands for any characters (`"bias"` matches `dense_1/bias`, `"dense*/kernel"`
/// matches `block/dense_2/kernel`), as BERT's `re.search` of plain words does.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut at) = name.find(first).map(|i| i + first.len()) else {
        return false;
    };
    for p in parts {
        match name[at..].find(p) {
            Some(i) => at += i + p.len(),
            None => return false,
        }
    }
    true
}

#[derive(Debug, Clone, Default)]
pub struct Graph {
    pub g: StableDiGraph<Node, u32>,
    pub outputs: Vec<Output>,
    pub metrics: Vec<Metric>,
    /// One per `minimize` of the train section, over disjoint variables.
    pub optimizers: Vec<Optimizer>,
    /// Whether the input feeding this (eval or predict) graph may end with a partial
    /// batch, which the runtime pads to the static batch size (set by elaboration).
    pub partial_batches: bool,
    /// How the graph ignores padding rows (set by the `mask_padding` pass).
    pub batch_mask: Option<BatchMask>,
    /// The names of the model's inputs (`features`, `labels.class`), one per leaf of
    /// the input's element, in the element's order (set by elaboration). An input the
    /// model does not read keeps its place here after a pass removed its node.
    pub feeds: Vec<String>,
    /// Which of `feeds` come from the model's labels parameter (its second): what the
    /// class-label checks guard (set by elaboration).
    pub label_feeds: Vec<String>,
}

/// The mask of real examples of a graph whose last batch may be padded: the runtime
/// feeds `input` with `true` for each real row, and keeps only the real rows of the
/// per-example outputs.
#[derive(Debug, Clone)]
pub struct BatchMask {
    /// The `bool[size]` input node of the mask.
    pub input: NodeIndex,
    /// The static batch size (rows per batch, padding included).
    pub size: usize,
    /// Indices into `outputs` of the outputs with one row per example (axis 0).
    pub per_example: Vec<usize>,
    /// The outputs that a padded batch would change (W0513), described for the
    /// run-time error (E0916) of a partial batch that actually arrives.
    pub inexact: Vec<String>,
}

/// The name of the mask input (not an identifier, so no model input can take it).
pub const MASK_INPUT: &str = "#mask";

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a node with its operands, in order.
    pub fn add(&mut self, op: Op, operands: &[NodeIndex], ty: TensorType, span: Span) -> NodeIndex {
        let n = self.g.add_node(Node { op, ty, span });
        for (i, &o) in operands.iter().enumerate() {
            self.g.add_edge(o, n, i as u32);
        }
        n
    }

    /// The outputs with this role, as (name, node), in order.
    pub fn outputs_with(&self, role: Role) -> Vec<(String, NodeIndex)> {
        self.outputs
            .iter()
            .filter(|o| o.role == role)
            .map(|o| (o.name.clone(), o.node))
            .collect()
    }

    /// The node of the first output with this role.
    pub fn output(&self, role: Role) -> Option<NodeIndex> {
        self.outputs.iter().find(|o| o.role == role).map(|o| o.node)
    }

    /// The input node named `name`.
    pub fn input(&self, name: &str) -> Option<NodeIndex> {
        self.g
            .node_indices()
            .find(|&n| matches!(&self.g[n].op, Op::Input { name: m } if m == name))
    }

    /// The variable node named `name`.
    pub fn variable(&self, name: &str) -> Option<NodeIndex> {
        self.g
            .node_indices()
            .find(|&n| matches!(&self.g[n].op, Op::Variable { name: m, .. } if m == name))
    }

    pub fn node(&self, n: NodeIndex) -> &Node {
        &self.g[n]
    }

    pub fn ty(&self, n: NodeIndex) -> &TensorType {
        &self.g[n].ty
    }

    /// The operands of `n`, in operand order (inline up to four: no allocation for
    /// almost every op).
    pub fn operands(&self, n: NodeIndex) -> Operands {
        let mut v: smallvec::SmallVec<[(u32, NodeIndex); 4]> = self
            .g
            .edges_directed(n, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        v.sort_unstable_by_key(|(i, _)| *i);
        v.into_iter().map(|(_, s)| s).collect()
    }

    /// Makes every use of `old` a use of `new` (operand indices kept), in the graph and
    /// in the outputs. `old` stays, without users.
    pub fn replace_uses(&mut self, old: NodeIndex, new: NodeIndex) {
        self.move_users(old, new);
        for o in &mut self.outputs {
            if o.node == old {
                o.node = new;
            }
        }
    }

    /// Makes every use of `old` by another node a use of `new` (operand indices kept);
    /// the outputs are left alone (see `replace_uses`).
    pub fn move_users(&mut self, old: NodeIndex, new: NodeIndex) {
        let uses: Vec<(NodeIndex, u32, petgraph::stable_graph::EdgeIndex)> = self
            .g
            .edges_directed(old, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight(), e.id()))
            .collect();
        for (user, idx, e) in uses {
            self.g.remove_edge(e);
            self.g.add_edge(new, user, idx);
        }
    }

    /// The nodes the program reads: outputs (losses, predictions, metric inputs, the
    /// learning rate) and every variable (they are saved in checkpoints).
    pub fn roots(&self) -> Vec<NodeIndex> {
        let mut r: Vec<NodeIndex> = self.outputs.iter().map(|o| o.node).collect();
        r.extend(
            self.g
                .node_indices()
                .filter(|&n| matches!(self.g[n].op, Op::Variable { .. })),
        );
        r
    }

    /// The nodes that compute `targets`, in topological order: their ancestors, stopping
    /// at the nodes `provided` (whose values come from outside, and which are left out).
    pub fn schedule(
        &self,
        targets: &[NodeIndex],
        provided: impl Fn(NodeIndex) -> bool,
    ) -> Vec<NodeIndex> {
        let mut need = vec![false; self.g.node_bound()];
        let mut stack: Vec<NodeIndex> = targets.to_vec();
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut need[n.index()], true) || provided(n) {
                continue;
            }
            stack.extend(self.operands(n));
        }
        self.topo_order()
            .into_iter()
            .filter(|&n| need[n.index()] && !provided(n))
            .collect()
    }

    /// The nodes in an order where every operand comes before its users; ties broken by
    /// index, so the order is deterministic.
    pub fn topo_order(&self) -> Vec<NodeIndex> {
        // Elaboration adds operands before their users and the passes keep that, so index
        // order is usually topological already: a linear check avoids the heap.
        if self.g.edge_references().all(|e| e.source() < e.target()) {
            return self.g.node_indices().collect();
        }
        self.topo_order_kahn()
    }

    fn topo_order_kahn(&self) -> Vec<NodeIndex> {
        let mut indeg: Vec<usize> = vec![0; self.g.node_bound()];
        for n in self.g.node_indices() {
            indeg[n.index()] = self.g.edges_directed(n, Direction::Incoming).count();
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<NodeIndex>> = self
            .g
            .node_indices()
            .filter(|n| indeg[n.index()] == 0)
            .map(std::cmp::Reverse)
            .collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let t = e.target();
                indeg[t.index()] -= 1;
                if indeg[t.index()] == 0 {
                    ready.push(std::cmp::Reverse(t));
                }
            }
        }
        order
    }

    /// Renumbers the nodes so that index order is a topological order. Passes that put
    /// a new node before an existing one call it: `topo_order` is then a linear scan
    /// again instead of Kahn's algorithm with a heap, for every later pass. Outputs and
    /// the batch mask follow their nodes.
    pub fn renumber(&mut self) {
        if self.g.edge_references().all(|e| e.source() < e.target()) {
            return;
        }
        let order = self.topo_order();
        let mut new_of = vec![NodeIndex::end(); self.g.node_bound()];
        let mut g: StableDiGraph<Node, u32> =
            StableDiGraph::with_capacity(order.len(), self.g.edge_count());
        for &n in &order {
            new_of[n.index()] = g.add_node(self.g[n].clone());
        }
        for e in self.g.edge_references() {
            g.add_edge(
                new_of[e.source().index()],
                new_of[e.target().index()],
                *e.weight(),
            );
        }
        self.g = g;
        for o in &mut self.outputs {
            o.node = new_of[o.node.index()];
        }
        if let Some(m) = &mut self.batch_mask {
            m.input = new_of[m.input.index()];
        }
    }

    /// Removes many nodes at once, with their edges, in time linear in the graph.
    /// (Removing nodes one by one costs the length of each operand's user list, which
    /// is quadratic when an operand has thousands of users.) Indices of the remaining
    /// nodes do not change.
    pub fn remove_nodes(&mut self, dead: &[NodeIndex]) {
        if dead.is_empty() {
            return;
        }
        let bound = self.g.node_bound();
        let mut gone = vec![false; bound];
        for &n in dead {
            gone[n.index()] = true;
        }
        let mut g: StableDiGraph<Node, u32> =
            StableDiGraph::with_capacity(bound, self.g.edge_count());
        let mut holes = Vec::new();
        for (i, &dead) in gone.iter().enumerate() {
            match self.g.node_weight(NodeIndex::new(i)) {
                Some(w) if !dead => {
                    g.add_node(w.clone());
                }
                _ => holes.push(g.add_node(Node {
                    op: Op::GlobalStep,
                    ty: super::TensorType::scalar(super::DType::I64),
                    span: Span::default(),
                })),
            }
        }
        for e in self.g.edge_references() {
            if !gone[e.source().index()] && !gone[e.target().index()] {
                g.add_edge(e.source(), e.target(), *e.weight());
            }
        }
        for h in holes.into_iter().rev() {
            g.remove_node(h);
        }
        self.g = g;
    }

    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }
}
