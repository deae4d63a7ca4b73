"""Wire and disk formats: graph, executable, compile service (generated modules beside)."""
