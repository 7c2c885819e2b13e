# A Transformer "big" in mixed precision, shaped like OpenSeq2Seq's
# transformer-big.py but laid out differently: shared dicts bound to names,
# tuples, backslash continuations and string concatenation.
from __future__ import (absolute_import, division,
                        print_function)
import tensorflow as tf
from open_seq2seq.models import Text2Text
from open_seq2seq.encoders import TransformerEncoder
from open_seq2seq.decoders import TransformerDecoder
from open_seq2seq.data.text2text.text2text import ParallelTextDataLayer
from open_seq2seq.losses import PaddedCrossEntropyLossWithSmoothing as Loss
from open_seq2seq.data.text2text.text2text import SpecialTextTokens as STT
from open_seq2seq.optimizers import lr_policies

base_model = Text2Text
d_model = 1024
heads = 16
layers = 6
data_root = '/raid/wmt16/'
vocab = data_root + \
    'm_common.vocab'

norm = {"type": "layernorm_L2", "epsilon": 1e-06}
dropout = 0.3
languages = ("en", "de")  # a tuple nobody reads

base_params = {
    "use_horovod": True,
    "batch_size_per_gpu": 256,
    "max_steps": 300000,
    "save_summaries_steps": 100,
    "print_loss_steps": 100,
    "print_samples_steps": None,
    "eval_steps": 4000,
    "save_checkpoint_steps": 4000,
    "num_checkpoints": 3,
    "iter_size": 2,
    "random_seed": 42,
    "logdir": "Transformer-BIG",
    "dtype": "mixed",
    "loss_scaling": "Backoff",
    "summaries": ['learning_rate', 'variables'],
    "optimizer": "Adam",
    "optimizer_params": {"beta1": 0.9, "beta2": 0.997, "epsilon": 1e-09},
    "lr_policy": lr_policies.transformer_policy,
    "lr_policy_params": {"learning_rate": 2.0, "warmup_steps": 8000, "d_model": d_model},
    "encoder": TransformerEncoder,
    "encoder_params": {
        "encoder_layers": layers, "hidden_size": d_model, "num_heads": heads,
        "filter_size": d_model * 4, "attention_dropout": 0.1,
        "relu_dropout": dropout, "layer_postprocess_dropout": dropout,
        "norm_params": norm, "remove_padding": True,
    },
    "decoder": TransformerDecoder,
    "decoder_params": {
        "num_hidden_layers": layers, "hidden_size": d_model, "num_heads": heads,
        "filter_size": d_model * 4, "attention_dropout": 0.1,
        "relu_dropout": dropout, "layer_postprocess_dropout": dropout,
        "norm_params": norm,
        "beam_size": 4, "alpha": 0.6, "extra_decode_length": 50,
        "EOS_ID": STT.EOS_ID.value, "GO_SYMBOL": STT.S_ID.value,
        "END_SYMBOL": STT.EOS_ID.value, "PAD_SYMBOL": STT.PAD_ID.value,
    },
    "loss": Loss,
    "loss_params": {"label_smoothing": 0.1},
    "data_layer": ParallelTextDataLayer,
    "data_layer_params": {
        "src_vocab_file": vocab, "tgt_vocab_file": vocab,
        "delimiter": " ", "use_start_token": False,
    },
}

train_params = {
    "data_layer_params": {
        "source_file": data_root + "train.en", "target_file": data_root + "train.de",
        "shuffle": True, "repeat": True, "max_length": 64,
    },
}
eval_params = {
    "eval_batch_size_per_gpu": 32,
    "data_layer_params": {
        "source_file": data_root + "newstest2013.en",
        "target_file": data_root + "newstest2013.de",
        "shuffle": False, "repeat": False, "max_length": 256,
    },
}
