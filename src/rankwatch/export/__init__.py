"""Exporters: each turns an analysed Run (and its summary) into one output format.

html: `rankwatch.export.html.write_html(run, summary, path)`, one self-contained,
offline HTML report with Plotly figures.

Exporters are the only place that draws; they read the tables `align()` made and
the summary dict, and change neither.
"""
