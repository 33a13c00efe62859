// Swagger UI over this service's own OpenAPI document; every asset is served locally.
/* global SwaggerUIBundle */
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  queryConfigEnabled: false,   // never load another spec named in the page's URL
  validatorUrl: null,          // no call to an online validator
});
