"""Differential privacy for the federation: accounting, DP-FedAvg, private sufficient statistics, DP-SGD.

See docs/privacy.md for what is protected, by which mechanism, and what each setting means.
Importing this package imports no torch and no accountant library; its modules do, when used.
"""
