// Package openseq2seq reads OpenSeq2Seq's Python config files and run.py's
// command line without a Python interpreter (docs/openseq2seq.md).
//
// The pyconfig files read the subset of Python the configs are written in:
// module-level imports and assignments of literals, names and arithmetic
// (pyconfig.go: the values; pyconfig_lex.go: the tokenizer;
// pyconfig_parse.go: the statements; pyconfig_expr.go: the expressions;
// pyconfig_eval.go: the operators). The config files turn a text2text
// Transformer config into a Config (config.go: Config, Load and the merging
// of the *_params dicts; config_override.go: run.py's overrides;
// config_rules.go: the treatment of every key; config_model.go: the model
// and training settings; config_modes.go: the data layers and what each
// --mode needs). args.go parses run.py's command line.
package openseq2seq
