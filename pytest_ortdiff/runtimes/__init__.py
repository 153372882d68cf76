"""The runtimes that produce outputs: onnxruntime (`OrtRunner`) and the torch evaluator (`TorchEvaluator`) with
its kernels, and what they share: loading and checking models, providers, the run's selection and caches."""
