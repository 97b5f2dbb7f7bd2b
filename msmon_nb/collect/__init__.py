"""MindSpore adapters: they turn framework objects into numbers; they never draw or write.

``mindspore`` is imported lazily, inside the functions that need it.
"""
