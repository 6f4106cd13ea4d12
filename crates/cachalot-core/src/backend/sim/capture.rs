//! The simulated device's stream captures: a graph of work nodes and, per
//! capturing stream, the frontier its next work will depend on.
//!
//! A test drives it as a program drives CUDA: [`Captures::begin`] starts a
//! capture on a stream, [`Captures::work`] adds a node after the stream's
//! frontier (a kernel), [`Captures::wait`] makes one stream's next work follow
//! another's (an event recorded on one and waited on by the other: the waiting
//! stream joins the capture), [`Captures::end`] ends the capture and forgets
//! its graph. One capture at a time, as the tests need no more.

use std::collections::{HashMap, HashSet};

use crate::backend::{GraphNode, StreamId};

/// The capture in progress, if any.
#[derive(Debug, Default)]
pub(super) struct Captures {
    /// Each node's dependencies, by node number (a node's [`GraphNode`] is its
    /// number plus one, so that no node is 0).
    deps: Vec<Vec<usize>>,
    /// The frontier of each stream taking part in the capture.
    frontier: HashMap<StreamId, Vec<usize>>,
}

impl Captures {
    /// Starts capturing on `stream`; false when a capture is in progress.
    pub(super) fn begin(&mut self, stream: StreamId) -> bool {
        if !self.frontier.is_empty() {
            return false;
        }
        self.frontier.insert(stream, Vec::new());
        true
    }

    /// Adds a node after `stream`'s frontier; `None` when it is not capturing.
    pub(super) fn work(&mut self, stream: StreamId) -> Option<GraphNode> {
        let deps = self.frontier.get(&stream)?.clone();
        let node = self.deps.len();
        self.deps.push(deps);
        self.frontier.insert(stream, vec![node]);
        Some(node_id(node))
    }

    /// Makes `stream`'s next work follow `on`'s frontier too (joining the
    /// capture); false when `on` is not capturing.
    pub(super) fn wait(&mut self, stream: StreamId, on: StreamId) -> bool {
        let Some(theirs) = self.frontier.get(&on).cloned() else {
            return false;
        };
        let ours = self.frontier.entry(stream).or_default();
        for n in theirs {
            if !ours.contains(&n) {
                ours.push(n);
            }
        }
        true
    }

    /// Ends the capture (every stream leaves it).
    pub(super) fn end(&mut self) {
        self.deps.clear();
        self.frontier.clear();
    }

    /// `stream`'s frontier, or `None` when it is not capturing.
    pub(super) fn frontier(&self, stream: StreamId) -> Option<Vec<GraphNode>> {
        let nodes = self.frontier.get(&stream)?;
        Some(nodes.iter().map(|&n| node_id(n)).collect())
    }

    /// Whether each of `marks` is in `stream`'s frontier or an ancestor of it.
    pub(super) fn follows(&self, stream: StreamId, marks: &[GraphNode]) -> bool {
        let Some(start) = self.frontier.get(&stream) else {
            return false;
        };
        let mut left: HashSet<u64> = marks.iter().map(|m| m.0).collect();
        let mut seen: HashSet<usize> = HashSet::new();
        let mut stack: Vec<usize> = start.clone();
        while let Some(n) = stack.pop() {
            if left.is_empty() {
                break;
            }
            if !seen.insert(n) {
                continue;
            }
            left.remove(&node_id(n).0);
            stack.extend(self.deps.get(n).into_iter().flatten().copied());
        }
        left.is_empty()
    }
}

fn node_id(n: usize) -> GraphNode {
    GraphNode(n as u64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_follows_what_it_waited_on_and_nothing_else() {
        let (s1, s2, s3) = (StreamId(1), StreamId(2), StreamId(3));
        let mut c = Captures::default();
        assert!(c.begin(s1));
        assert!(!c.begin(s2), "one capture at a time");
        assert!(c.wait(s2, s1), "s2 joins");
        assert!(!c.wait(s1, s3), "s3 is not capturing");
        let a = c.work(s2).expect("s2 captures");
        assert!(!c.follows(s1, &[a]));
        assert!(c.follows(s2, &[a]));
        assert!(c.wait(s1, s2));
        let b = c.work(s1).expect("s1 captures");
        assert!(c.follows(s1, &[a, b]), "a is an ancestor of b");
        assert_eq!(c.frontier(s1), Some(vec![b]));
        assert!(c.follows(s1, &[]), "nothing to follow");
        assert_eq!(c.frontier(s3), None);
        assert!(!c.follows(s3, &[]), "not capturing");
        c.end();
        assert_eq!(c.frontier(s1), None);
        assert!(c.begin(s3));
    }
}
