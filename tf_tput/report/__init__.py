"""Reports from result records: console tables, report.md, results.csv, PNG plots,
comparisons of two result files, and the paper's published figures (published.py).

Entry point: `python -m tf_tput.report` (tf_tput/report/__main__.py).
"""
