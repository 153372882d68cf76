"""The runtimes that produce outputs: onnxruntime (`OrtRunner`) and the torch evaluator (`TorchEvaluator`)."""
