"""fastudy's deviation-bound report: turns a study's outputs (OUT/*.csv, OUT/*.h5) into
OUT/report.html (self-contained) and OUT/report.md with plots in OUT/report_files/.

Run: /usr/bin/python3 analysis/report OUT   (or `fastudy report OUT`, which does the same).
Needs Debian's python3-matplotlib, python3-numpy and python3-h5py.
Modules: readers (files), verdict, microbench, training, deviation, provenance (one per report
section), doc/render (the document tree, HTML and Markdown), figures (plot output), cli.
"""
