"""Tensor and expert parallelism: process groups, shard layouts, collectives."""
