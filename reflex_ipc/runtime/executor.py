"""The executor: runs a model over its state.

It owns what every algorithm (generate, system1, embed, ...) needs below the
level of tokens and text: the state (allocated at first use, sized to what is
asked — a power of two of at least STATE_MIN slots, at most n_ctx — and grown
keeping what it holds), batching and chunked prefill, the decode loop, prefix
reuse between requests, and captured-graph replays on backends that can capture
(`ops.capture`). Algorithms call `prefill`, `decode`, `forward` and `argmax`;
models see only `forward(state, batch, ...)`.
"""

from __future__ import annotations


STATE_MIN = 256  # smallest state, in slots


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Executor:
    def __init__(self, ops, model, n_ctx):
        self.n_ctx = int(n_ctx)
        self.state = None
        self._decoder = None  # graphs.DecodeGraph
        self._graphs = None  # graphs.ForwardGraphs
        self._graph_logits = None
        # called between decode steps and between prefill chunks while set: the runner's
        # hand-over to a backend that became ready (Runner.adopt; handover.py)
        self.mover = None
        # the request's prefix-store session (runtime/prefixstore.py), set by the runner
        self.store = None
        self._use(ops, model)

    def _use(self, ops, model):
        self.ops, self.model = ops, model
        self.chunk = ops.prefill_chunk
        # captured graphs where the backend can capture and its switch allows (ops.graphs:
        # $REFLEX_CUDA_GRAPH on cuda, $REFLEX_CPU_GRAPH on cpu)
        self.use_graphs = (hasattr(ops, "capture") and getattr(model, "capturable", True)
                           and getattr(ops, "graphs", True))
        # padded batch graphs (ForwardGraphs) put padding tokens before the real ones, which a
        # recurrence would take in: recurrent models replay only the decode step
        self.use_forward_graphs = self.use_graphs and not self.recurrent

    def move_to(self, ops, model) -> int:
        """Continue on another backend (handover.py): the state's held tokens and arrays are
        copied into a new state of the same size on `ops` (the model `model`, the same GGUF
        loaded there), the captured graphs dropped. Returns the bytes moved."""
        from ..handover import state_nbytes

        st = self.state
        snap = st.snapshot() if st is not None and st.tokens else None
        n_slots = st.n_slots if st is not None else 0
        moved = state_nbytes(st) if snap is not None else 0
        self.close()
        self._use(ops, model)
        if n_slots:
            self.reserve(n_slots)
            if snap is not None:
                self.state.restore(*snap)
        return moved

    # -- state -------------------------------------------------------------------
    @property
    def recurrent(self) -> bool:
        """Whether the model keeps per-sequence state (which prefix reuse cannot truncate)."""
        return any(s.kind == "seq" for s in self.model.state_spec())

    def reserve(self, n_slots, n_seq=1):
        """A state of at least n_slots (<= n_ctx) slots and n_seq sequences. A larger one
        replaces a smaller, keeping the tokens it holds."""
        st = self.state
        if st is not None and st.n_slots >= n_slots and st.n_seq >= n_seq:
            return st
        cap = STATE_MIN
        while cap < n_slots:
            cap *= 2
        cap = max(min(cap, self.n_ctx), st.n_slots if st is not None else 0)
        n_seq = max(n_seq, st.n_seq if st is not None else 1)
        self._drop_graphs()  # they hold the old state's addresses
        if st is not None and st.tokens:
            self.state = st.grown(cap, n_seq)
        else:
            self.state = None  # the old state's memory goes back before the new one is taken
            self.state = self.model.new_state(self.ops, cap, n_seq) if n_seq > 1 else \
                self.model.new_state(self.ops, cap)
        return self.state

    @property
    def tokens(self):
        """The token ids whose state is held (positions 0..len-1)."""
        return self.state.tokens if self.state is not None else []

    def forget(self):
        """Hold no tokens (the next request starts from an empty state)."""
        if self.state is not None:
            self.state.clear()

    def close(self):
        self._drop_graphs()
        self.state = None

    def _drop_graphs(self):
        for g in (self._decoder, self._graphs):
            if g is not None:
                g.close()
        self._decoder = self._graphs = None
        self._graph_logits = None

    # -- forward passes -------------------------------------------------------------
    def forward(self, ids, pos, slots=None, allowed=None, key_pos=None, rows=None, output="logits",
                check=None, seqs=None):
        """model.forward over one batch (runtime.batch.Batch has the arguments) on the current
        state. Small batch shapes seen before replay a captured graph where the backend
        can capture; otherwise the model runs op by op."""
        from .batch import Batch

        if seqs is not None:  # several sequences: always op by op
            b = Batch(self.ops, ids, pos, slots=slots, allowed=allowed, key_pos=key_pos, seqs=seqs)
            return self.model.forward(self.state, b, rows=rows, output=output, check=check)
        if self._graphs is None and self.use_forward_graphs:
            from .graphs import ForwardGraphs

            self._graphs = ForwardGraphs(self.ops, self.model, self.state)
        if self._graphs is not None:
            if check is not None:
                check()  # a replay cannot stop between layers
            out = self._graphs(ids, pos, slots, allowed, key_pos, rows, output)
            if out is not None:
                return out
        b = Batch(self.ops, ids, pos, slots=slots, allowed=allowed, key_pos=key_pos)
        out = self.model.forward(self.state, b, rows=rows, output=output, check=check)
        if self._graphs is not None:
            self._graphs.saw(b, rows, output)
        return out

    def begin(self, ids, *, room=0, reuse=True, n_seq=1):
        """Prepare the state for a request whose tokens start with `ids`: keep the longest
        common prefix of the held tokens and ids (with reuse; at most len(ids) - 1, so that
        the last id is evaluated and gives logits), drop the rest, and make room for
        len(ids) + room tokens. Returns how many leading ids are held."""
        from .. import phases

        phases.mark("prefill_begin")  # the request's prompt tokenized
        n = len(ids)
        held = 0
        if self.state is not None:
            held = min(common_prefix(self.state.tokens, ids), n - 1) if reuse else 0
            if not self.state.truncate(held):
                held = 0
        self.reserve(n + room, n_seq)
        phases.mark("state_reserved")
        if self.store is not None:  # the prefix store may hold more of ids (reads it with reuse)
            held = self.store.extend(ids, held, load=reuse)
        return held

    def _spans(self, lo, hi):
        """The chunks [a, e) that evaluate ids lo..hi-1: at most `chunk` tokens, also cut where
        the prefix store captures recurrent state."""
        cuts = set(range(lo + self.chunk, hi, self.chunk))
        if self.store is not None:
            cuts.update(self.store.stops(lo, hi))
        a = lo
        for e in sorted(c for c in cuts if lo < c < hi) + [hi]:
            yield a, e
            a = e

    def prefill(self, ids, *, room=0, reuse=True, check=None, n_seq=1):
        """Make the state hold `ids`, with room for `room` more tokens after them. Returns
        (the logits after the last id [1, V] as a backend array, how many leading ids were
        already held and not evaluated again; see `begin`)."""
        ids = [int(i) for i in ids]
        held = self.begin(ids, room=room, reuse=reuse, n_seq=n_seq)
        logits = None
        spans = list(self._spans(held, len(ids)))
        i = 0
        while i < len(spans):
            a, e = spans[i]
            if a > held and self.mover is not None and n_seq == 1:
                chunk_size = self.chunk
                self.mover()  # between chunks: a hand-over takes the state as it is
                if self.chunk != chunk_size:  # the new backend's chunks from here on
                    spans[i:] = self._spans(a, len(ids))
                    a, e = spans[i]
            st = self.state
            chunk = ids[a:e]
            logits = self.forward(chunk, range(a, e), rows=slice(len(chunk) - 1, len(chunk)), check=check)
            st.tokens.extend(chunk)
            if self.store is not None:
                self.store.at(st, e)
            i += 1
        return logits, held

    def hidden(self, ids, check=None, reuse=False):
        """The final-normed hidden states of ids, evaluated from an empty state (with reuse:
        of those after the leading ids already held, see `begin`): yields a backend array
        [n, n_embd] per chunk. The state then holds ids."""
        ids = [int(i) for i in ids]
        held = self.begin(ids, reuse=reuse)
        st = self.state
        for a, e in self._spans(held, len(ids)):
            chunk = ids[a:e]
            yield self.forward(chunk, range(a, e), output="hidden", check=check)
            st.tokens.extend(chunk)
            if self.store is not None:
                self.store.at(st, e)

    def step(self, token, check=None):
        """Evaluate one token after the held ones (slot = position = len(tokens)): its logits
        [1, V]. Backends that capture replay one graph per step; per-layer cancellation then
        gives way to the check between tokens."""
        st = self.state
        pos = len(st.tokens)
        if pos >= st.n_slots:
            st = self.reserve(pos + 1)
        if self._decoder is None and self.use_graphs:
            from .graphs import DecodeGraph

            self._decoder = DecodeGraph(self.ops, self.model, st)
        if self._decoder is not None:
            logits = self._graph_logits = self._decoder(token, pos)
        else:
            logits = self.forward([token], [pos], check=check)
        st.tokens.append(int(token))
        return logits

    def decode(self, logits, choose, check=None):
        """The decode loop: yields choose(logits) for the logits after the held tokens, then,
        each time the consumer asks for the next token, evaluates the last one and chooses
        again. A consumer that stops asking leaves its last token unevaluated (not held)."""
        while True:
            token = choose(logits)
            yield token
            if check is not None:
                check()
            if self.mover is not None:
                self.mover()  # the state holds every evaluated token; `token` is evaluated next
            logits = self.step(token, check)

    def argmax(self, logits) -> int:
        """The greedy token of logits [1, V] (computed inside the decode graph when these are
        its logits)."""
        if logits is self._graph_logits and self._decoder is not None:
            return self._decoder.argmax()
        return int(self.ops.argmax(logits)[0])
