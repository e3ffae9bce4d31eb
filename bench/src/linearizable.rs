//! A linearizability checker for histories of operations on independent
//! keys (Wing and Gong's search, with Lowe's and Porcupine's cache of
//! visited states): each key's history is linearizable when its
//! operations can be put in one order, each taking effect at one moment
//! between its call and its return, in which the model explains every
//! output seen. An operation whose outcome is unknown (a timeout, a
//! connection lost) may take effect at any moment after its call, or
//! never: its output is not checked.
//!
//! The soak's clients record every operation with its invocation and
//! completion times; this says whether the store behaved as one copy.

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

/// What the store is taken to be: a sequential object.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;
    fn init(&self) -> Self::State;
    /// The state after `input`, when `output` is what it could answer in
    /// `state` (None: not in that state).
    fn step(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> Option<Self::State>;
}

/// One operation as a client saw it: called at `call`, answered at
/// `ret` (None: its outcome is not known).
#[derive(Clone, Debug)]
pub struct Operation<I, O> {
    pub key: String,
    pub input: I,
    pub output: O,
    pub call: u64,
    pub ret: Option<u64>,
}

/// A register: writes set it, reads return it (None before any write).
#[derive(Clone, Copy, Debug, Default)]
pub struct Register;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterInput {
    Read,
    Write(String),
}

impl Model for Register {
    type State = Option<String>;
    type Input = RegisterInput;
    /// What a read returned (a write's is not looked at).
    type Output = Option<String>;

    fn init(&self) -> Self::State {
        None
    }

    fn step(&self, state: &Self::State, input: &RegisterInput, output: &Option<String>) -> Option<Self::State> {
        match input {
            RegisterInput::Write(value) => Some(Some(value.clone())),
            RegisterInput::Read => (output == state).then(|| state.clone()),
        }
    }
}

/// Where a history fails to be linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub key: String,
    /// The operations of that key, by index in the history given.
    pub operations: Vec<usize>,
}

/// Checks every key's operations on its own; the first key (by name)
/// whose history cannot be linearized.
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>]) -> Result<(), Violation> {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, op) in history.iter().enumerate() {
        by_key.entry(op.key.as_str()).or_default().push(i);
    }
    for (key, indexes) in by_key {
        let ops: Vec<&Operation<M::Input, M::Output>> = indexes.iter().map(|&i| &history[i]).collect();
        if !linearizable(model, &ops) {
            return Err(Violation { key: key.to_string(), operations: indexes });
        }
    }
    Ok(())
}

/// An event of the search's list: an operation's call or its return.
#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    call: bool,
    prev: usize,
    next: usize,
    /// A call's return entry (itself for an operation with none).
    ret: usize,
}

/// Whether `ops` (one key's) can be linearized: the search walks the
/// events in time order, linearizing a called operation when the model
/// accepts it and the (linearized set, state) pair is new, and backing
/// out the last choice when it reaches the return of one not linearized.
fn linearizable<M: Model>(model: &M, ops: &[&Operation<M::Input, M::Output>]) -> bool {
    // Events in time order; at one moment calls first (they may be
    // concurrent with what returns then). An unknown outcome returns at
    // the end of time: it may take effect at any moment after its call.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, true, i));
        events.push((op.ret.unwrap_or(u64::MAX), false, i));
    }
    events.sort_by_key(|(time, call, op)| (*time, !*call, *op));
    // A doubly linked list with a head sentinel at 0.
    let mut entries = vec![Entry { op: usize::MAX, call: false, prev: 0, next: 1, ret: 0 }];
    let mut return_of = vec![0; ops.len()];
    for (n, (_, call, op)) in events.iter().enumerate() {
        let index = n + 1;
        entries.push(Entry { op: *op, call: *call, prev: index - 1, next: index + 1, ret: index });
        if !call {
            return_of[*op] = index;
        }
    }
    let end = entries.len();
    for entry in entries.iter_mut().skip(1) {
        if entry.call {
            entry.ret = return_of[entry.op];
        }
    }
    let unlink = |entries: &mut Vec<Entry>, at: usize| {
        let (prev, next) = (entries[at].prev, entries[at].next);
        entries[prev].next = next;
        if next < end {
            entries[next].prev = prev;
        }
    };
    let relink = |entries: &mut Vec<Entry>, at: usize| {
        let (prev, next) = (entries[at].prev, entries[at].next);
        entries[prev].next = at;
        if next < end {
            entries[next].prev = at;
        }
    };
    let mut linearized = vec![false; ops.len()];
    let mut seen: HashSet<(Vec<bool>, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut state = model.init();
    let mut at = entries[0].next;
    while entries[0].next < end {
        if at >= end {
            // Past the end with operations left: only their returns
            // remain, each one not linearized.
            match stack.pop() {
                None => return false,
                Some((call, before)) => {
                    at = back_out(&mut entries, &mut linearized, call, &relink);
                    state = before;
                    continue;
                }
            }
        }
        let entry = entries[at];
        if entry.call {
            let op = ops[entry.op];
            if let Some(next) = model.step(&state, &op.input, &op.output) {
                let mut chosen = linearized.clone();
                chosen[entry.op] = true;
                if seen.insert((chosen.clone(), next.clone())) {
                    stack.push((at, state));
                    state = next;
                    linearized = chosen;
                    unlink(&mut entries, at);
                    unlink(&mut entries, entry.ret);
                    at = entries[0].next;
                    continue;
                }
            }
            at = entry.next;
        } else {
            // The return of an operation not linearized: the last choice
            // was wrong.
            let Some((call, before)) = stack.pop() else { return false };
            at = back_out(&mut entries, &mut linearized, call, &relink);
            state = before;
        }
    }
    true
}

/// Undoes the linearization of the operation called at `call`: its
/// events back in the list; the search goes on after its call.
fn back_out(
    entries: &mut Vec<Entry>,
    linearized: &mut [bool],
    call: usize,
    relink: &impl Fn(&mut Vec<Entry>, usize),
) -> usize {
    let entry = entries[call];
    linearized[entry.op] = false;
    relink(entries, entry.ret);
    relink(entries, call);
    entries[call].next
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn op(
        input: RegisterInput,
        output: Option<&str>,
        call: u64,
        ret: Option<u64>,
    ) -> Operation<RegisterInput, Option<String>> {
        Operation { key: "k".into(), input, output: output.map(str::to_string), call, ret }
    }

    fn write(v: &str, call: u64, ret: u64) -> Operation<RegisterInput, Option<String>> {
        op(RegisterInput::Write(v.into()), None, call, Some(ret))
    }

    fn read(v: Option<&str>, call: u64, ret: u64) -> Operation<RegisterInput, Option<String>> {
        op(RegisterInput::Read, v, call, Some(ret))
    }

    #[test]
    fn a_stale_read_after_a_write_returned_is_not_linearizable_and_one_concurrent_with_it_is() {
        let ok = [write("a", 0, 10), read(Some("a"), 11, 12), write("b", 13, 20), read(Some("a"), 14, 15)];
        assert_eq!(check(&Register, &ok), Ok(()), "the read ran while b was being written");
        let stale = [write("a", 0, 10), write("b", 11, 20), read(Some("a"), 21, 22)];
        assert_eq!(check(&Register, &stale), Err(Violation { key: "k".into(), operations: vec![0, 1, 2] }));
        let never = [read(Some("z"), 0, 1)];
        assert!(check(&Register, &never).is_err(), "a value nobody wrote");
    }

    #[test]
    fn an_unknown_outcome_may_take_effect_late_or_never() {
        let lost = op(RegisterInput::Write("b".into()), None, 5, None);
        let late = [write("a", 0, 1), lost.clone(), read(Some("a"), 10, 11), read(Some("b"), 20, 21)];
        assert_eq!(check(&Register, &late), Ok(()), "it took effect between the reads");
        let never = [write("a", 0, 1), lost, read(Some("a"), 10, 11)];
        assert_eq!(check(&Register, &never), Ok(()), "it never did");
        let before_call =
            [write("a", 0, 1), read(Some("b"), 2, 3), op(RegisterInput::Write("b".into()), None, 5, None)];
        assert!(check(&Register, &before_call).is_err(), "not before it was called");
    }

    #[test]
    fn keys_are_checked_apart() {
        let mut other = read(Some("a"), 21, 22);
        other.key = "other".into();
        let history = [write("a", 0, 10), write("b", 11, 20), other];
        assert!(check(&Register, &history).is_err(), "key other was never written");
    }

    /// A history a real register could give: operations take effect one
    /// at a time in the order drawn, each inside a window around that
    /// moment that may overlap others'.
    fn any_history() -> impl Strategy<Value = Vec<Operation<RegisterInput, Option<String>>>> {
        prop::collection::vec((any::<bool>(), 0..3u8, 0..20u64, 0..20u64, any::<bool>()), 1..14).prop_map(|drawn| {
            let mut value: Option<String> = None;
            drawn
                .into_iter()
                .enumerate()
                .map(|(i, (is_write, v, before, after, known))| {
                    // Moments 10 apart, windows up to 19 either side: they overlap.
                    let at = 100 + 10 * i as u64;
                    let (input, output) = match is_write {
                        true => {
                            value = Some(format!("v{v}"));
                            (RegisterInput::Write(format!("v{v}")), None)
                        }
                        false => (RegisterInput::Read, value.clone()),
                    };
                    let ret = (known || !is_write).then_some(at + after);
                    Operation { key: "k".into(), input, output, call: at - before, ret }
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn what_a_register_did_is_linearizable(history in any_history()) {
            prop_assert_eq!(check(&Register, &history), Ok(()));
        }

        #[test]
        fn a_read_of_a_value_overwritten_before_it_was_called_is_caught(history in any_history()) {
            // A read, after everything returned, of a value every write of
            // which returned before the last write (known to have taken
            // effect) was called: that write, or a later one of another
            // value, comes after them all, so no order explains it.
            let last = history.iter().rev().find(|op| matches!(op.input, RegisterInput::Write(_)));
            let Some(Operation { input: RegisterInput::Write(last_value), ret: Some(_), call: last_call, .. }) = last
            else {
                return Ok(());
            };
            let before_last = |value: &String| {
                let mut writes = history.iter().filter(|op| op.input == RegisterInput::Write(value.clone()));
                writes.all(|w| w.ret.is_some_and(|ret| ret < *last_call))
            };
            let stale = history.iter().find_map(|op| match &op.input {
                RegisterInput::Write(v) if v != last_value && before_last(v) => Some(v.clone()),
                _ => None,
            });
            let Some(stale) = stale else { return Ok(()) };
            let end = history.iter().filter_map(|op| op.ret).max().unwrap_or(0) + 1;
            let mut bad = history.clone();
            bad.push(op(RegisterInput::Read, Some(&stale), end, Some(end + 1)));
            prop_assert!(check(&Register, &bad).is_err(), "{:?} read after {:?}", stale, last_value);
        }
    }
}
