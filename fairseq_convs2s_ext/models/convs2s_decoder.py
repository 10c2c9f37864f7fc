"""The ConvS2S decoder (sections 3.1 to 3.3)."""
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.models import FairseqIncrementalDecoder
from fairseq.modules import FairseqDropout

from ..checkpoints.dictionaries import BUFFER, check_fingerprint, fingerprint
from ..modules import GLUConvolution, Linear, MultiStepAttention, WordPositionEmbedding, scaled_sum
from ..modules.beam_reordering import sentences_kept
from ..modules.multistep_attention import ProjectedSource
from ..modules.output_projection import FCONV_NAME, OutputProjection


@dataclass
class ProjectedSources:
    """Each layer's projections of the source in a beam search (None: a layer without
    attention), for ``rows`` encoder rows of ``beam`` hypotheses each."""
    layers: List[Optional[ProjectedSource]]
    rows: int
    beam: int


@dataclass
class WordProducts:
    """The first convolution's products W_s W_1 w with the words a search has seen:
    ``products`` (k x room for words x 2d) holds the first ``seen``, ``index`` each
    vocabulary id's place among them (-1: not seen)."""
    index: torch.Tensor
    seen: int
    products: torch.Tensor


class ConvS2SDecoder(FairseqIncrementalDecoder):
    """Embeddings g of the previous target elements, a linear map to the first block's width,
    blocks of causal GLU convolutions each with an optional attention (table 5) and a
    residual connection, then linear maps to the output embedding size and to the
    vocabulary, W_o (:mod:`fairseq_convs2s_ext.modules.output_projection`, over the whole
    vocabulary or over candidate words).

    Incremental decoding keeps the last k inputs of every convolution, so a step costs the
    same whatever the length of the prefix; the first convolution, whose inputs are linear in
    the embeddings, is looked up instead: its products with each word seen are kept
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
        self.project_sources_once = True  # see projected_sources
        self.fold_fc2 = True  # see make_generation_fast_
        self.look_up_first_convolution = True  # see first_convolution_looked_up
        self.fc2 = Linear(channels, out_embed_dim)
        if share_input_output_embed:
            if out_embed_dim != embed_dim:
                raise ValueError(
                    f"--share-input-output-embed needs --decoder-out-embed-dim ({out_embed_dim}) "
                    f"equal to --decoder-embed-dim ({embed_dim})"
                )
            self.output_projection = OutputProjection(out_embed_dim, len(dictionary))
            nn.init.zeros_(self.output_projection.bias)
            self.output_projection.weight = self.embed.tokens.weight
        else:
            self.output_projection = Linear(out_embed_dim, len(dictionary), dropout=dropout, layer=OutputProjection)

    def forward(self, prev_output_tokens, encoder_out, incremental_state=None, candidates=None,
                return_all_attention=False, reuse_logits=False, first_step_logits_copied=True, **unused):
        """prev_output_tokens: B x T. Returns logits (B x T x V) and {"attn": [B x T x S]}, the
        attention averaged over the layers that attend. With ``candidates`` (target ids,
        vocabulary selection), logits over those words only (B x T x the candidates'
        columns); they and ``reuse_logits`` are :class:`OutputProjection`'s.
        ``return_all_attention`` (off in generation) adds {"layer_attn": [B x T x S]}, each
        attending layer's own, in order. ``first_step_logits_copied`` off: at a beam search's
        first step (:meth:`first_step_once`) the logits have one row a sentence, those of all
        of its hypotheses (the lean beam step copies what it takes from them)."""
        if self.is_first_beam_step(prev_output_tokens, encoder_out, incremental_state):
            return self.first_step_once(prev_output_tokens, encoder_out, incremental_state, candidates,
                                        return_all_attention, first_step_logits_copied)
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
        logits = self.output_projection(self.dropout(self.fc2(x)), candidates, incremental_state, reuse_logits)
        average = None if attention_sum is None else attention_sum / self.num_attention_layers
        extra = {"attn": [average]}
        if return_all_attention:
            extra["layer_attn"] = layer_attention
        return logits, extra

    def is_first_beam_step(self, prev_output_tokens, encoder_out, incremental_state):
        """Whether this is the first step of a beam search in which the b hypotheses of every
        sentence have the same prefix (fairseq's do: each is the sentence's bos)."""
        beam = encoder_out.get("beam", 1) if encoder_out is not None else 1
        if beam == 1 or incremental_state is None or prev_output_tokens.size(1) != 1:
            return False
        by_sentence = prev_output_tokens.view(-1, beam, 1)
        return torch.equal(by_sentence, by_sentence[:, :1].expand_as(by_sentence))

    def first_step_once(self, prev_output_tokens, encoder_out, incremental_state, candidates, return_all_attention,
                        logits_copied=True):
        """The first step computed for one hypothesis of each sentence, then copied to its b
        (the logits unless ``logits_copied`` is off, the attention and the incremental state,
        as if every hypothesis had been computed): (b - 1)/b of the step's work. Each row's
        numbers are those the hypotheses would get each on its own: over fewer rows a matrix
        multiply gave a row the same bits on the CPU measured (bench/README.md as of 86165d7~,
        "What each lever bought"), and the hypotheses stayed fconv's."""
        beam = encoder_out["beam"]
        if candidates is not None and candidates.dim() == 2:  # each sentence's rows, for its b hypotheses
            self.output_projection.gather_rows(candidates, prev_output_tokens.size(0), incremental_state)
        # with the rows kept, an ordinary step over one hypothesis a sentence
        logits, extra = self.forward(prev_output_tokens[::beam], dict(encoder_out, beam=1), incremental_state,
                                     candidates, return_all_attention)
        copies = torch.arange(logits.size(0), device=logits.device).repeat_interleave(beam)
        self.reorder_incremental_state_scripting(incremental_state, copies)
        extra = {key: [None if a is None else a.index_select(0, copies) for a in value] for key, value in extra.items()}
        return (logits.index_select(0, copies) if logits_copied else logits), extra

    def first_convolution_looked_up(self, prev_output_tokens, incremental_state):
        """The first block's convolution at an incremental step, without its matrix multiply;
        None outside incremental decoding, when dropout is on (it would fall between) and
        without ``look_up_first_convolution`` (``--quantize int8`` turns it off).

        The block's input is fc1 of the embeddings, fc1(w_j + p_j) = W_1 w_j + fc1(p_j), so its
        convolution over the window of the last k target elements j (zeros before the first) is
        W [fc1(w_j + p_j) ..] + b_w = sum over the window's slots s of W_s W_1 w_j, plus
        W [fc1(p_j) ..] + b_w, the positions' part, which is the same for every hypothesis: one
        row a step. The k products W_s W_1 w of a word are made the first time the search sees
        it (:meth:`word_products`); a beam search sees few of the vocabulary's words. The
        numbers are the same up to rounding."""
        if incremental_state is None or not self.look_up_first_convolution or any(
            dropout.p > 0 and (dropout.training or dropout.apply_during_inference)
            for dropout in (self.dropout, self.embed.dropout)
        ):
            return None
        convolution = self.convolutions[0]
        k, steps = convolution.kernel_width, prev_output_tokens.size(1)
        words = prev_output_tokens[:, -k:]  # the window's words, the oldest first
        products, index = self.word_products(words, incremental_state)
        slots = torch.arange(k - words.size(1), k, device=words.device) * products.size(1)
        y = F.embedding_bag(index + slots, products.view(-1, products.size(-1)), mode="sum")  # gathered and summed
        positions = torch.arange(steps - k + 1, steps + 1, device=words.device).clamp(min=0)
        fc1_p = self.fc1(self.embed.positions.weight[positions + self.dictionary.pad()])  # k x d
        fc1_p = fc1_p.masked_fill((positions == 0).unsqueeze(1), 0.0)  # zeros before the first
        y = y + convolution.linear(fc1_p.view(1, -1))
        return F.glu(y, dim=-1).unsqueeze(1)

    def word_products(self, words, incremental_state):
        """The first convolution's products W_s W_1 w with each word seen in this search, for
        each of the k slots s of its window (k x words seen x 2d), and the index of each of
        ``words`` among them. A word not seen before is added."""
        linear, k = self.convolutions[0].linear, self.convolutions[0].kernel_width
        table = self.get_incremental_state(incremental_state, "word_products")
        if table is None:
            table = WordProducts(index=words.new_full((len(self.dictionary),), -1), seen=0,
                                 products=linear.bias.new_empty(k, 0, linear.out_features))
            self.set_incremental_state(incremental_state, "word_products", table)
        index = table.index[words]
        if bool((index < 0).any()):
            new = words[index < 0].unique()
            seen = table.seen + len(new)
            table.index[new] = torch.arange(table.seen, seen, device=words.device)
            w_s = linear.weight.view(linear.out_features, k, -1).transpose(0, 1)  # k x 2d x d
            products = torch.matmul(F.linear(self.embed.tokens(new), self.fc1.weight), w_s.transpose(1, 2))
            if seen > table.products.size(1):  # doubled: growing by the new words alone copies it every step
                grown = products.new_empty(k, 2 * seen, products.size(-1))
                grown[:, : table.seen] = table.products[:, : table.seen]
                table.products = grown
            table.products[:, table.seen : seen] = products
            table.seen = seen
            index = table.index[words]
        return table.products, index

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
        make as many as it saves, so it keeps the layers' own projections, as every search
        does without ``project_sources_once``."""
        if incremental_state is None or encoder_out.get("beam", 1) == 1 or not self.project_sources_once:
            return [None] * len(self.attention)
        sources = self.get_incremental_state(incremental_state, "projected_sources")
        rows = encoder_out["encoder_out"][0].size(0)
        if sources is None or sources.rows != rows:  # first step, or the encoder's rows changed
            layers = [None if attention is None else attention.project_source(encoder_out)
                      for attention in self.attention]
            sources = ProjectedSources(layers, rows, encoder_out["beam"])
            self.set_incremental_state(incremental_state, "projected_sources", sources)
        return sources.layers

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        """fairseq's entry point (SequenceGenerator calls it at every step), which looks for the
        modules that keep state among all of the decoder's at every step. They are the
        decoder, its convolutions and W_o."""
        for module in (self, *self.convolutions, self.output_projection):
            module.reorder_incremental_state(incremental_state, new_order)

    def reorder_incremental_state(self, incremental_state, new_order):
        """Keep the projected sources of the sentences still searched (fairseq keeps a
        sentence's hypotheses together and its sentences in order)."""
        sources = self.get_incremental_state(incremental_state, "projected_sources")
        if sources is not None:
            sentences = sentences_kept(new_order, sources.beam, sources.rows)
            if sentences is not None:
                sources.layers = [None if layer is None else ProjectedSource(*(t.index_select(0, sentences) for t in layer))
                                  for layer in sources.layers]
                sources.rows = len(sentences)

    def make_generation_fast_(self, need_attn=False, retain_dropout=False, **kwargs):
        """Generation only: keep the attention if alignments are wanted (``need_attn``), and
        fold fc2 into W_o (:meth:`OutputProjection.fold_`) unless ``fold_fc2`` is off. The fold
        is skipped where it would not pay or not hold: fc2 narrowing its input (W_o W_2 would
        be wider than W_o), W_o tied to the input embeddings (a second table), dropout kept in
        generation (between the two)."""
        self.need_attn = need_attn
        if isinstance(self.fc2, nn.Identity):
            return  # folded already
        tied = self.output_projection.weight is self.embed.tokens.weight
        if not self.fold_fc2 or retain_dropout or tied or self.fc2.in_features > self.fc2.out_features:
            return
        self.output_projection.fold_(self.fc2)  # on the model's device, in its dtype
        self.fc2 = nn.Identity()

    def upgrade_state_dict_named(self, state_dict, name):
        """Load W_o saved under fconv's name (``fc3``), and refuse a checkpoint trained with
        another target dictionary (see checkpoints.dictionaries)."""
        prefix = f"{name}." if name else ""
        for key in [k for k in state_dict if k.startswith(f"{prefix}{FCONV_NAME}.")]:
            state_dict[f"{prefix}output_projection{key[len(prefix + FCONV_NAME):]}"] = state_dict.pop(key)
        check_fingerprint(state_dict, f"{name}.{BUFFER}", self.dictionary, "target")
        return state_dict

    def max_positions(self):
        return self.embed.max_positions

