# The lab's run: OpenSeq2Seq's text2text Transformer-base on WMT16 en->de, in
# OpenSeq2Seq's own config format, with the values the lab uses (data_root,
# logdir, batch_size_per_gpu 128, eval repeat True). nmt-train reads it as is,
# without Python (docs/openseq2seq.md), and so does OpenSeq2Seq's run.py:
#
#   bin/gorun -n 4 -H vm1:2,vm2:2 bin/nmt-train --config_file=configs/lab-base.py \
#       --use_horovod=True --mode=train_eval
#
# The data: OpenSeq2Seq's scripts/get_en_de.sh /data/wmt16_de_en, the same path
# on every host. The first run prepares it into a cache (it says where).
from __future__ import absolute_import, division, print_function
from open_seq2seq.models import Text2Text
from open_seq2seq.encoders import TransformerEncoder
from open_seq2seq.decoders import TransformerDecoder
from open_seq2seq.data.text2text.text2text import ParallelTextDataLayer
from open_seq2seq.losses import PaddedCrossEntropyLossWithSmoothing
from open_seq2seq.data.text2text.text2text import SpecialTextTokens
from open_seq2seq.data.text2text.tokenizer import EOS_ID
from open_seq2seq.optimizers.lr_policies import transformer_policy
import tensorflow as tf

base_model = Text2Text
d_model = 512
num_layers = 6

data_root = "/data/wmt16_de_en/"
vocab = data_root + "m_common.vocab"

base_params = {
  "use_horovod": True,
  "num_gpus": 1,                 # the ranks come from the launcher
  "batch_size_per_gpu": 128,     # sentence pairs per GPU (the lab's edit of 256)
  "max_steps": 300000,
  "save_summaries_steps": 100,
  "print_loss_steps": 100,
  "print_samples_steps": 100,
  "eval_steps": 4001,
  "save_checkpoint_steps": 299998,
  "logdir": "runs/lab-base",
  "dtype": tf.float32,

  "optimizer": tf.contrib.opt.LazyAdamOptimizer,
  "optimizer_params": {"beta1": 0.9, "beta2": 0.997, "epsilon": 1e-09},

  "lr_policy": transformer_policy,
  "lr_policy_params": {"learning_rate": 2.0, "warmup_steps": 8000, "d_model": d_model},

  "encoder": TransformerEncoder,
  "encoder_params": {
    "encoder_layers": num_layers,
    "hidden_size": d_model,
    "num_heads": 8,
    "filter_size": 4 * d_model,
    "attention_dropout": 0.1,
    "relu_dropout": 0.1,
    "layer_postprocess_dropout": 0.1,
    "pad_embeddings_2_eight": True,
    "remove_padding": True,
  },

  "decoder": TransformerDecoder,
  "decoder_params": {
    "num_hidden_layers": num_layers,
    "hidden_size": d_model,
    "num_heads": 8,
    "filter_size": 4 * d_model,
    "attention_dropout": 0.1,
    "relu_dropout": 0.1,
    "layer_postprocess_dropout": 0.1,
    "beam_size": 4,
    "alpha": 0.6,
    "extra_decode_length": 50,
    "EOS_ID": EOS_ID,
    "GO_SYMBOL": SpecialTextTokens.S_ID.value,
    "END_SYMBOL": SpecialTextTokens.EOS_ID.value,
    "PAD_SYMBOL": SpecialTextTokens.PAD_ID.value,
  },

  "loss": PaddedCrossEntropyLossWithSmoothing,
  "loss_params": {"label_smoothing": 0.1},
}

train_params = {
  "data_layer": ParallelTextDataLayer,
  "data_layer_params": {
    "src_vocab_file": vocab,
    "tgt_vocab_file": vocab,
    "source_file": data_root + "train.clean.en.shuffled.BPE_common.32K.tok",
    "target_file": data_root + "train.clean.de.shuffled.BPE_common.32K.tok",
    "delimiter": " ",
    "shuffle": True,
    "shuffle_buffer_size": 25000,
    "repeat": True,
    "map_parallel_calls": 16,
    "max_length": 56,
    "pad_vocab_to_eight": True,
  },
}

eval_params = {
  "batch_size_per_gpu": 16,
  "data_layer": ParallelTextDataLayer,
  "data_layer_params": {
    "src_vocab_file": vocab,
    "tgt_vocab_file": vocab,
    "source_file": data_root + "wmt13-en-de.src.BPE_common.32K.tok",
    "target_file": data_root + "wmt13-en-de.ref.BPE_common.32K.tok",
    "delimiter": " ",
    "shuffle": False,
    "repeat": True,              # the lab's edit
    "max_length": 256,
  },
}

infer_params = {
  "batch_size_per_gpu": 1,
  "data_layer": ParallelTextDataLayer,
  "data_layer_params": {
    "src_vocab_file": vocab,
    "tgt_vocab_file": vocab,
    "source_file": data_root + "wmt14-en-de.src.BPE_common.32K.tok",
    "target_file": data_root + "wmt14-en-de.src.BPE_common.32K.tok",
    "delimiter": " ",
    "shuffle": False,
    "repeat": False,
    "max_length": 256,
  },
}
