# The two commands: `make run` (every notebook at smoke size) and `make test`.
# Both create .venv and install requirements.txt on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test test-quick lab lab-link submit reset catch-up solutions stack-up stack-down stack-status notebooks export site bench lint compose-check clean-runs

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -e .
	@# JupyterLab's jupyter-events pulls in rfc3987-syntax (jsonschema[format-nongpl]), whose import
	@# builds an IRI grammar: 2 s in every process that imports Ray (Ray imports jsonschema), so in
	@# every kernel and Ray worker. Nothing here checks IRIs; jsonschema skips that format without it.
	$(PY) -m pip uninstall --quiet --yes rfc3987-syntax
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install everything

run: $(STAMP)  ## start the embedded stack (fetching lakeFS where it is missing and there is internet) and execute every notebook into runs/
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner

TEST_PROCESSES ?= 2
NBVAL := --nbval-lax --nbval-current-env --nbval-cell-timeout=600 --nbval-sanitize-with tests/suite/nbval_sanitize.cfg
test: $(STAMP)  ## unit + notebook tests against real local services (each test process starts its own private stack), and nbval over the committed notebooks
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --timings-json runs/test-timings.json $(NBVAL) tests notebooks

QUICK ?= not notebook and not slow
test-quick: $(STAMP)  ## the inner loop (2 min): no notebook run end to end, no slow test; QUICK="not notebook" adds the slow ones (11 min)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --timings-json runs/test-timings.json -m "$(QUICK)" tests

LAB_ARGS ?=
lab: $(STAMP)  ## JupyterLab on the notebooks, the stack, its Ray with the dashboard; prints every URL (LAB_ARGS="--jupyter-port 8890")
	$(PY) -m workshop.stack up --download-lakefs --no-ray
	$(PY) -m workshop.lab $(LAB_ARGS)

lab-link: $(STAMP)  ## a new one-time sign-in link for the running lab's Ray dashboard (each link works once)
	@$(PY) -m workshop.lab --sign-in-link

NB ?=
ARGS ?=
ADDRESS ?=
submit: $(STAMP)  ## a notebook as a Ray Job on the lab's Ray or a cluster: make submit NB=04 ARGS="-p epochs 3" [ADDRESS=http://<head>:8265]
	@test -n "$(NB)" || { echo "error: name a notebook: make submit NB=04 ARGS=\"-p epochs 3\""; exit 2; }
	$(PY) -m workshop.submit $(NB) $(ARGS) $(if $(ADDRESS),--address $(ADDRESS))

reset: $(STAMP)  ## stop the embedded stack and delete its data (buckets, MLflow runs, lakeFS repositories) and runs/
	$(PY) -m workshop.stack down
	rm -rf .stack runs

catch-up: $(STAMP)  ## run the notebooks before NN headlessly (make catch-up NN=04), to join a workshop there
	@test -n "$(NN)" || { echo "make catch-up NN=04: NN is the number of the notebook you join at"; exit 2; }
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner --before $(NN)

stack-up: $(STAMP)
	$(PY) -m workshop.stack up

stack-down: $(STAMP)
	$(PY) -m workshop.stack down

stack-status: $(STAMP)
	$(PY) -m workshop.stack status

notebooks: $(STAMP)  ## refresh the committed notebooks' outputs: one run of all, from a clean tree, on a fresh private stack
	$(PY) benchmarks/refresh_notebooks.py

solutions: $(STAMP)  ## for an instructor: every notebook with every exercise's solution run, into runs/solutions-<time>/
	$(PY) -m workshop.stack up --download-lakefs
	$(PY) -m workshop.runner --solutions

export: $(STAMP)  ## regenerate helpers' lesson modules from the notebooks' #@save cells
	$(PY) -m workshop.export

site: $(STAMP)  ## the lessons as a website in runs/site/html, from the committed outputs (warnings are errors, links and offline checked); preview: python -m http.server -d runs/site/html
	$(PY) -m workshop.site

bench: $(STAMP) stack-up  ## benchmarks: JSON in benchmarks/results/, a table on stdout
	$(PY) benchmarks/bench_upload_listing.py
	$(PY) benchmarks/bench_data_loading.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_tune.py
	$(PY) benchmarks/bench_tune.py --smoke-test-size 12000
	$(PY) benchmarks/bench_smoke.py --lakefs-double
	$(PY) benchmarks/bench_smoke.py --lakefs-double --ray lab --label "make lab's Ray"
	$(PY) benchmarks/bench_inference.py
	$(PY) benchmarks/bench_serve.py
	$(PY) benchmarks/bench_full_size.py
	$(PY) benchmarks/bench_scale.py --cleanup
	$(PY) benchmarks/bench_site.py

lint: $(STAMP)
	$(VENV)/bin/ruff check helpers workshop tests benchmarks

compose-check:  ## needs a Docker engine
	docker compose config --quiet

clean-runs:
	rm -rf runs/
