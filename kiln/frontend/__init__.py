"""Model importers: turn models from other frameworks into kiln IRModules.

``kiln.frontend.onnx.from_onnx`` imports ONNX models. Importers are imported on demand so that
``import kiln`` does not need the framework packages installed.
"""
