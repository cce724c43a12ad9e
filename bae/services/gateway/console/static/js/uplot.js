// uPlot (static/vendor/uplot), loaded the first time a page draws a chart: a <script> and its
// style sheet are added to the document once, and every later caller gets the same promise.

let loading = null;

export function loadUplot() {
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const style = document.createElement("link");
      style.rel = "stylesheet";
      style.href = "static/vendor/uplot/uPlot.min.css";
      const script = document.createElement("script");
      script.src = "static/vendor/uplot/uPlot.iife.min.js";
      script.addEventListener("load", () => resolve(window.uPlot));
      script.addEventListener("error", () => {
        script.remove();
        style.remove();
        loading = null; // a later page may try again
        reject(new Error("the chart library (static/vendor/uplot) did not load"));
      });
      document.head.append(style, script);
    });
  }
  return loading;
}
