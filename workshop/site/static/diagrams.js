// Draws each <pre class="mermaid"> on the page as an inline SVG, with the vendored mermaid loaded before
// this file (workshop/site/diagrams.py). "strict": a diagram's labels cannot run scripts.
mermaid.initialize({
  startOnLoad: true,
  securityLevel: "strict",
  theme: document.documentElement.dataset.theme === "dark" ? "dark" : "default",
});
