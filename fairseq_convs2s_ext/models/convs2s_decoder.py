"""The ConvS2S decoder (sections 3.1 to 3.3)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import FairseqDropout

from ..checkpoints.dictionaries import BUFFER, check_fingerprint, fingerprint
from ..data.vocabulary_selection import sentences_kept
from ..modules import GLUConvolution, Linear, MultiStepAttention, WordPositionEmbedding, scaled_sum


class ConvS2SDecoder(FairseqIncrementalDecoder):
    """Embeddings g of the previous target elements, a linear map to the first block's width,
    blocks of causal GLU convolutions each with an optional attention (table 5) and a
    residual connection, then linear maps to the output embedding size and to the
    vocabulary: p(y_{i+1} | y_1..y_i, x) = softmax(W_o h_i^L + b_o), over the whole
    vocabulary or over a batch's candidate words (vocabulary selection, ``output_layer``).

    Incremental decoding keeps the last k inputs of every convolution, so a step costs the
    same whatever the length of the prefix; the first convolution, whose inputs are linear in
    the embeddings, is looked up instead: its products with each word met are kept
    (:meth:`first_convolution_looked_up`). In a beam search it also keeps each attention's
    projections of the source (:meth:`projected_sources`), made once per sentence, and
    computes the first step once per sentence (:meth:`first_step_once`). The attention
    returned for generation is the average over the layers that have one; like fconv's, it
    is left out (None) after ``make_generation_fast_(need_attn=False)``, which
    fairseq-generate calls unless alignments are printed, so beam search keeps no attention
    buffers it does not use.
    """

    def __init__(self, dictionary, embed_dim, layers, attention, out_embed_dim, dropout, max_positions,
                 share_input_output_embed=False):
        super().__init__(dictionary)
        self.register_buffer(BUFFER, fingerprint(dictionary))  # checked on load
        padding_idx = dictionary.pad()
        self.embed = WordPositionEmbedding(len(dictionary), embed_dim, padding_idx, max_positions, dropout)
        self.dropout = FairseqDropout(dropout, module_name=type(self).__name__)
        channels = layers[0][0]
        self.fc1 = Linear(embed_dim, channels, dropout=dropout)
        self.residual_projections = nn.ModuleList()
        self.convolutions = nn.ModuleList()
        self.attention = nn.ModuleList()
        for (out_channels, kernel_width), attends in zip(layers, attention):
            self.residual_projections.append(nn.Identity() if out_channels == channels else Linear(channels, out_channels))
            self.convolutions.append(GLUConvolution(channels, out_channels, kernel_width, dropout, causal=True))
            self.attention.append(MultiStepAttention(out_channels, embed_dim) if attends else None)
            channels = out_channels
        self.num_attention_layers = sum(attention)
        self.need_attn = True
        self.rest_clusters = None  # see estimate_rest
        self.fc2 = Linear(channels, out_embed_dim)
        if share_input_output_embed:
            if out_embed_dim != embed_dim:
                raise ValueError(
                    f"--share-input-output-embed needs --decoder-out-embed-dim ({out_embed_dim}) "
                    f"equal to --decoder-embed-dim ({embed_dim})"
                )
            self.fc3 = nn.Linear(out_embed_dim, len(dictionary))
            nn.init.zeros_(self.fc3.bias)
            self.fc3.weight = self.embed.tokens.weight
        else:
            self.fc3 = Linear(out_embed_dim, len(dictionary), dropout=dropout)

    def forward(self, prev_output_tokens, encoder_out, incremental_state=None, candidates=None,
                return_all_attention=False, reuse_logits=False, **unused):
        """prev_output_tokens: B x T. Returns logits (B x T x V) and {"attn": [B x T x S]}, the
        attention averaged over the layers that attend. With ``candidates`` (target ids,
        vocabulary selection, see :meth:`output_layer`), logits over those words only (B x T
        x the candidates' columns).
        ``return_all_attention`` (off in generation) adds {"layer_attn": [B x T x S]}, each
        attending layer's own, in order. ``reuse_logits``: see :meth:`output_layer`."""
        if self.starts_alike(prev_output_tokens, encoder_out, incremental_state):
            return self.first_step_once(prev_output_tokens, encoder_out, incremental_state, candidates,
                                        return_all_attention)
        g = self.embed(prev_output_tokens, incremental_state)
        x = self.fc1(g)
        first_convolution = self.first_convolution_looked_up(prev_output_tokens, incremental_state)
        attention_sum, layer_attention = None, []
        for layer, (residual_projection, convolution, attention, source) in enumerate(zip(
            self.residual_projections, self.convolutions, self.attention,
            self.projected_sources(encoder_out, incremental_state),
        )):
            residual = residual_projection(x)
            if layer == 0 and first_convolution is not None:
                x = first_convolution
            else:
                x = convolution(self.dropout(x), incremental_state)
            if attention is not None:
                x, a = attention(x, g, encoder_out, source)
                if self.need_attn or return_all_attention:
                    attention_sum = a if attention_sum is None else attention_sum + a
                if return_all_attention:
                    layer_attention.append(a)
            x = scaled_sum(x, residual)
        logits = self.output_layer(self.dropout(self.fc2(x)), candidates, incremental_state, reuse_logits)
        average = None if attention_sum is None else attention_sum / self.num_attention_layers
        extra = {"attn": [average]}
        if return_all_attention:
            extra["layer_attn"] = layer_attention
        return logits, extra

    def starts_alike(self, prev_output_tokens, encoder_out, incremental_state):
        """Whether this is the first step of a beam search in which the b hypotheses of every
        sentence have the same prefix (fairseq's do: each is the sentence's bos)."""
        beam = encoder_out.get("beam", 1) if encoder_out is not None else 1
        if beam == 1 or incremental_state is None or prev_output_tokens.size(1) != 1:
            return False
        by_sentence = prev_output_tokens.view(-1, beam, 1)
        return torch.equal(by_sentence, by_sentence[:, :1].expand_as(by_sentence))

    def first_step_once(self, prev_output_tokens, encoder_out, incremental_state, candidates, return_all_attention):
        """The first step computed for one hypothesis of each sentence, then copied to its b
        (logits, attention and the incremental state, as if every hypothesis had been
        computed): 4/5 of the step's work at beam 5, which is about a twentieth of a beam
        search over Multi30k. Each row's numbers are those the hypotheses would get each on
        its own: over fewer rows a matrix multiply gave a row the same bits on the CPU
        measured (bench/README.md), and the hypotheses stayed fconv's."""
        beam = encoder_out["beam"]
        if candidates is not None and candidates.dim() == 2:  # each sentence's rows, for its b hypotheses
            self.set_incremental_state(incremental_state, "candidate_rows",
                                       self.rows_of(candidates, hypotheses=prev_output_tokens.size(0)))
        # with the rows kept, an ordinary step over one hypothesis a sentence
        logits, extra = self.forward(prev_output_tokens[::beam], dict(encoder_out, beam=1), incremental_state,
                                     candidates, return_all_attention)
        copies = torch.arange(logits.size(0), device=logits.device).repeat_interleave(beam)
        self.reorder_incremental_state_scripting(incremental_state, copies)
        extra = {key: [None if a is None else a.index_select(0, copies) for a in value] for key, value in extra.items()}
        return logits.index_select(0, copies), extra

    def first_convolution_looked_up(self, prev_output_tokens, incremental_state):
        """The first block's convolution at an incremental step, without its matrix multiply;
        None outside incremental decoding and when dropout is on (it would fall between).

        The block's input is fc1 of the embeddings, fc1(w_j + p_j) = W_1 w_j + fc1(p_j), so its
        convolution over the window of the last k target elements j (zeros before the first) is
        W [fc1(w_j + p_j) ..] + b_w = sum over the window's slots s of W_s W_1 w_j, plus
        W [fc1(p_j) ..] + b_w, the positions' part, which is the same for every hypothesis: one
        row a step. The k products W_s W_1 w of a word are made the first time the search meets
        it (:meth:`word_products`); a beam search meets few words, about a thousand over
        Multi30k's 1000 test sentences. The numbers are the same up to rounding."""
        if incremental_state is None or any(
            dropout.p > 0 and (dropout.training or dropout.apply_during_inference)
            for dropout in (self.dropout, self.embed.dropout)
        ):
            return None
        convolution = self.convolutions[0]
        k, steps = convolution.kernel_width, prev_output_tokens.size(1)
        words = prev_output_tokens[:, -k:]  # the window's words, the oldest first
        products, index = self.word_products(words, incremental_state)
        slots = torch.arange(k - words.size(1), k, device=words.device) * products.size(1)
        y = products.view(-1, products.size(-1)).index_select(0, (index + slots).view(-1))
        positions = torch.arange(steps - k + 1, steps + 1, device=words.device).clamp(min=0)
        fc1_p = self.fc1(self.embed.positions.weight[positions + self.dictionary.pad()])  # k x d
        fc1_p = fc1_p.masked_fill((positions == 0).unsqueeze(1), 0.0)  # zeros before the first
        y = y.view(*words.shape, -1).sum(1) + convolution.linear(fc1_p.view(1, -1))
        return F.glu(y, dim=-1).unsqueeze(1)

    def word_products(self, words, incremental_state):
        """The first convolution's products W_s W_1 w with each word met in this search, for
        each of the k slots s of its window (k x words met x 2d), and the index of each of
        ``words`` among them. A word not met before is added."""
        linear, k = self.convolutions[0].linear, self.convolutions[0].kernel_width
        table = self.get_incremental_state(incremental_state, "word_products")
        if table is None:
            table = {"index": words.new_full((len(self.dictionary),), -1), "met": 0,
                     "products": linear.bias.new_empty(k, 0, linear.out_features)}
            self.set_incremental_state(incremental_state, "word_products", table)
        index = table["index"][words]
        if bool((index < 0).any()):
            new = words[index < 0].unique()
            met = table["met"] + len(new)
            table["index"][new] = torch.arange(table["met"], met, device=words.device)
            w_s = linear.weight.view(linear.out_features, k, -1).transpose(0, 1)  # k x 2d x d
            products = torch.matmul(F.linear(self.embed.tokens(new), self.fc1.weight), w_s.transpose(1, 2))
            if met > table["products"].size(1):  # doubled: growing by the new words copied 330 MB on BPE
                grown = products.new_empty(k, 2 * met, products.size(-1))
                grown[:, : table["met"]] = table["products"][:, : table["met"]]
                table["products"] = grown
            table["products"][:, table["met"] : met] = products
            table["met"] = met
            index = table["index"][words]
        return table["products"], index

    @property
    def attending_layers(self):
        """The numbers (from 1) of the decoder layers that have an attention."""
        return [number for number, attention in enumerate(self.attention, 1) if attention is not None]

    def projected_sources(self, encoder_out, incremental_state):
        """Each attending layer's projections of the source (``MultiStepAttention.project_source``)
        when a beam search reads each encoder row with b > 1 hypotheses, else None per layer.
        They are made at a search's first step, kept in the incremental state and follow the
        sentences as they finish (:meth:`reorder_incremental_state`): a projection per source
        word and sentence instead of one per hypothesis and step. Greedy search (b = 1) would
        make as many as it saves, so it keeps the layers' own projections."""
        if incremental_state is None or encoder_out.get("beam", 1) == 1:
            return [None] * len(self.attention)
        sources = self.get_incremental_state(incremental_state, "projected_sources")
        rows = encoder_out["encoder_out"][0].size(0)
        if sources is None or sources["rows"] != rows:  # first step, or the encoder's rows changed
            layers = [None if attention is None else attention.project_source(encoder_out)
                      for attention in self.attention]
            sources = {"layers": layers, "rows": rows, "beam": encoder_out["beam"]}
            self.set_incremental_state(incremental_state, "projected_sources", sources)
        return sources["layers"]

    def output_layer(self, features, candidates=None, incremental_state=None, reuse_logits=False):
        """W_o h + b_o: logits of every word, or of the ``candidates`` only (vocabulary
        selection: only their rows of W_o and b_o are used). ``candidates`` are the sorted
        ids of the batch's words (1-D), or each sentence's words (S x C, padded with negative
        ids, whose logits are -inf), the hypotheses of a sentence being consecutive rows of
        ``features``. The leading columns that hold one word in every row (or none: a negative
        id) are scored for every hypothesis with one matrix multiply, as the batch's words
        are, and are -inf in the rows of the sentences without them
        (``VocabularySelection.candidates_per_sentence`` puts the specials, the most common
        words and the words many sentences share there). Each sentence's other words' rows
        are gathered into a sentence x word x channel tensor, multiplied by its hypotheses
        alone. In a beam search the gathered rows are kept in the incremental state, gathered
        once for the batch and compacted in place as sentences finish
        (:meth:`reorder_incremental_state`). After :meth:`estimate_rest`, each sentence's
        logits end with a column per cluster of the words outside its candidates, which count
        in the softmax's normaliser but are not words.

        ``reuse_logits`` (for a caller done with a step's logits before the next step, as the
        lean beam step is): the whole vocabulary's logits are written into one tensor kept in
        the incremental state, overwritten at every step. A new hypotheses x V tensor each
        step is fresh memory from the system, whose first touch costs about a tenth of the
        product at V = 18k on a CPU. The values are fc3's (``F.linear`` is this ``addmm``).
        Features in another dtype than the layer's (under autocast) go through fc3, which casts.
        (The dtype is read from b_o: W_o, when weight normalized, is recomputed at each read.)"""
        if candidates is None:
            if not reuse_logits or incremental_state is None or features.dtype != self.fc3.bias.dtype:
                return self.fc3(features)
            positions = features.size(0) * features.size(1)
            logits = self.get_incremental_state(incremental_state, "logits")
            if logits is None or logits.size(0) < positions:
                logits = features.new_empty(positions, self.fc3.out_features)
                self.set_incremental_state(incremental_state, "logits", logits)
            torch.addmm(self.fc3.bias, features.reshape(positions, -1), self.fc3.weight.t(), out=logits[:positions])
            return logits[:positions].view(*features.shape[:2], -1)
        rows = self.get_incremental_state(incremental_state, "candidate_rows")
        if rows is None:
            rows = self.rows_of(candidates, hypotheses=features.size(0))
            if incremental_state is not None:
                self.set_incremental_state(incremental_state, "candidate_rows", rows)
        logits = F.linear(features, *rows["every_hypothesis"])
        if candidates.dim() == 1:
            return logits
        hypotheses, steps, channels = features.shape
        sentences = rows["weight"].size(0)
        by_sentence_logits = logits.view(sentences, -1, logits.size(-1))
        words = rows["words"]  # the columns scored for every hypothesis that are words; then the rest's
        if rows["absent"] is not None:  # -inf added: 10x faster than a broadcast masked_fill_
            by_sentence_logits[..., :words].add_(rows["absent"].unsqueeze(1))
        if rows["rest"] is not None:
            by_sentence_logits[..., words:].add_(rows["rest"].unsqueeze(1))
        if rows["weight"].size(1) == 0:
            return logits
        by_sentence = features.reshape(sentences, -1, channels)
        # each sentence's rows times its few hypotheses (words x hypotheses), faster than the
        # hypotheses times the rows' transpose: 4-10% of selection's time on BPE (bench/README.md)
        own = torch.baddbmm(rows["bias"].unsqueeze(2), rows["weight"], by_sentence.transpose(1, 2))
        parts = [by_sentence_logits[..., :words], own.transpose(1, 2), by_sentence_logits[..., words:]]
        return torch.cat(parts, dim=-1).view(hypotheses, steps, -1)

    def estimate_rest(self, clusters):
        """Generation with each sentence's candidates: ``clusters`` (a cluster id for each word
        of the vocabulary, -1 for the words every sentence has; ``VocabularySelection.
        cluster_rest``) makes :meth:`output_layer` add, after the candidates' logits, one
        column per cluster that stands for the cluster's words that are not the sentence's
        candidates, so that the softmax's normaliser counts them; None: the candidates alone."""
        count = 0 if clusters is None else int(clusters.max()) + 1
        self.rest_clusters = (clusters, count) if count > 0 else None

    def rest_columns(self, candidates) -> int:
        """How many columns after the words' the logits over ``candidates`` have (see
        :meth:`estimate_rest`)."""
        if self.rest_clusters is None or candidates is None or candidates.dim() != 2:
            return 0
        return self.rest_clusters[1]

    def rest_rows(self, candidates):
        """The rows of the columns that stand for the words outside each sentence's
        ``candidates`` (see :meth:`estimate_rest`, ``VocabularySelection.cluster_rest``):
        each cluster's mean row of W_o and mean of b_o, and for each sentence the log of how
        many of the cluster's words it lacks (-inf where none)."""
        # per batch, from W_o as it is: a generator built in training (--eval-bleu) sees it change
        clusters, count = self.rest_clusters
        clusters = clusters.to(candidates.device)
        slot = torch.where(clusters >= 0, clusters, count)  # the words every sentence has: a slot left out
        size = torch.bincount(slot, minlength=count + 1)[:count].to(self.fc3.bias.dtype)
        weight = self.fc3.weight.new_zeros(count + 1, self.fc3.in_features).index_add_(0, slot, self.fc3.weight)
        bias = self.fc3.bias.new_zeros(count + 1).index_add_(0, slot, self.fc3.bias)
        weight, bias = weight[:count] / size.clamp(min=1).unsqueeze(1), bias[:count] / size.clamp(min=1)
        cluster = clusters[candidates.clamp(min=0)]
        taken = torch.zeros(len(candidates), count, dtype=size.dtype, device=size.device)
        taken.scatter_add_(1, cluster.clamp(min=0), ((candidates >= 0) & (cluster >= 0)).to(size.dtype))
        return weight, bias, (size - taken).log()

    def rows_of(self, candidates, hypotheses):
        """The rows of W_o and b_o of ``candidates`` (b_o is -inf where there is no word): of
        the words scored for every hypothesis (all of a batch's). For each sentence's also ``absent``, -inf where a sentence lacks one of
        those words and 0 elsewhere (None if every sentence has them all); the rows and bias
        of each sentence's other words; after :meth:`estimate_rest`, the rows of the columns
        that stand for the words outside the candidates (:meth:`rest_rows`) after the words'
        scored for every hypothesis, and each sentence's log counts of them (``rest``, else
        None); how many of the columns scored for every hypothesis are words; and the number
        of hypotheses of a sentence."""
        if candidates.dim() == 1:
            return {"every_hypothesis": (self.fc3.weight.index_select(0, candidates),
                                         self.fc3.bias.index_select(0, candidates))}
        word = candidates.max(0).values  # of each column, where a row has one
        one_word = ((candidates == word) | (candidates < 0)).all(0)
        width = int(one_word.cumprod(0).sum())
        ids = word[:width].clamp(min=0)
        every_hypothesis = self.fc3.weight.index_select(0, ids), self.fc3.bias.index_select(0, ids)
        missing = candidates[:, :width] < 0
        absent = None
        if missing.any():
            absent = torch.zeros_like(missing, dtype=every_hypothesis[1].dtype).masked_fill_(missing, float("-inf"))
        own = candidates[:, width:]
        words = own.clamp(min=0).reshape(-1)  # index_select copies whole rows: faster than indexing
        weight = self.fc3.weight.index_select(0, words).view(*own.shape, self.fc3.in_features)
        bias = self.fc3.bias.index_select(0, words).view_as(own).masked_fill(own < 0, float("-inf"))
        rest = None
        if self.rest_clusters is not None:  # its rows after the words', in the same product
            rest_weight, rest_bias, rest = self.rest_rows(candidates)
            every_hypothesis = (torch.cat([every_hypothesis[0], rest_weight]),
                                torch.cat([every_hypothesis[1], rest_bias]))
        return {"every_hypothesis": every_hypothesis, "words": width, "absent": absent, "weight": weight,
                "bias": bias, "rest": rest, "beam": hypotheses // len(candidates)}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        """fairseq's entry point (SequenceGenerator calls it at every step), which looks for the
        modules that keep state among all of the decoder's (66 here: about 1% of a beam search).
        They are the decoder and its convolutions."""
        for module in (self, *self.convolutions):
            module.reorder_incremental_state(incremental_state, new_order)

    def reorder_incremental_state(self, incremental_state, new_order):
        """Keep the gathered W_o rows and the projected sources of the sentences still
        searched (fairseq keeps a sentence's hypotheses together and its sentences in order).
        The W_o rows move down over those of finished sentences, in place, so that no second
        copy of them is made; the projected sources, a few rows per sentence, are selected."""
        rows = self.get_incremental_state(incremental_state, "candidate_rows")
        if rows is not None and "beam" in rows:  # not a batch's rows, which are the same for every row
            sentences = sentences_kept(new_order, rows["beam"], len(rows["bias"]))
            if sentences is not None:
                rows.update(weight=keep_rows_(rows["weight"], sentences), bias=keep_rows_(rows["bias"], sentences))
                if rows["absent"] is not None:
                    rows["absent"] = rows["absent"].index_select(0, sentences)
                if rows["rest"] is not None:
                    rows["rest"] = rows["rest"].index_select(0, sentences)
        sources = self.get_incremental_state(incremental_state, "projected_sources")
        if sources is not None:
            sentences = sentences_kept(new_order, sources["beam"], sources["rows"])
            if sentences is not None:
                sources["layers"] = [None if layer is None else {k: t.index_select(0, sentences) for k, t in layer.items()}
                                     for layer in sources["layers"]]
                sources["rows"] = len(sentences)

    def make_generation_fast_(self, need_attn=False, retain_dropout=False, **kwargs):
        """Generation only: keep the attention if alignments are wanted (``need_attn``), and
        fold fc2 into the output layer, W_o (W_2 x + b_2) + b_o = (W_o W_2) x + (W_o b_2 + b_o),
        one product per step instead of two. The fold is skipped where it would not pay or
        not hold: fc2 narrowing its input (W_o W_2 would be wider than W_o), W_o tied to the
        input embeddings (a second table), dropout kept in generation (between the two)."""
        self.need_attn = need_attn
        if isinstance(self.fc2, nn.Identity):
            return  # folded already
        tied = self.fc3.weight is self.embed.tokens.weight
        if retain_dropout or tied or self.fc2.in_features > self.fc2.out_features:
            return
        output = nn.Linear(self.fc2.in_features, self.fc3.out_features, device="meta")  # no initial weights
        with torch.no_grad():  # on the model's device, in its dtype (fairseq-generate moves it first)
            output.weight = nn.Parameter(self.fc3.weight @ self.fc2.weight)
            output.bias = nn.Parameter(F.linear(self.fc2.bias, self.fc3.weight, self.fc3.bias))
        self.fc2, self.fc3 = nn.Identity(), output

    def upgrade_state_dict_named(self, state_dict, name):
        """Refuse a checkpoint trained with another target dictionary (see checkpoints.dictionaries)."""
        check_fingerprint(state_dict, f"{name}.{BUFFER}", self.dictionary, "target")
        return state_dict

    def max_positions(self):
        return self.embed.max_positions


def keep_rows_(tensor, rows):
    """The ``rows`` of ``tensor`` (increasing indices) moved down in place to its first rows,
    which are returned: no second copy is made."""
    for i, r in enumerate(rows.tolist()):
        assert r >= i, "fairseq keeps the sentences left in their order"
        if r != i:
            tensor[i].copy_(tensor[r])
    return tensor[: len(rows)]
